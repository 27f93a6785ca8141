"""ContinuationService: the app handle. Composes the store, blobs, capabilities and worker.

The HTTP facade and the CLI are thin layers over the methods here. Every state change goes
through a pure lifecycle function and one WAL transaction; the service holds a per-record
lock around read-modify-write so concurrent requests on one continuation serialize, and the
store's version check (``expect``) catches anything that slips past.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
import shlex
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import msgspec

from ..blobs import BlobCorruptError, BlobStore
from ..config import Config, ConfigError
from ..config import detached_token as read_detached_token
from ..continuations import lifecycle
from ..continuations.capabilities import (
    claim_mac,
    claim_token,
    continuation_id,
    fingerprint,
    operator_token,
    parse_claim_token,
    result_token,
    verify_bearer,
    verify_host_token,
    verify_metrics_token,
    verify_operator_token,
    verify_result_token,
)
from ..continuations.errors import (
    AdmissionLimit,
    Closed,
    Conflict,
    Forbidden,
    InvalidRequest,
    InvalidTransition,
    NotFound,
    ServiceDisabled,
    Unauthorized,
)
from ..continuations.health import assess
from ..continuations.model import (
    INLINE_PAYLOAD_MAX,
    MODES,
    STATES,
    Activation,
    Claim,
    Continuation,
    Mode,
    ResultRecord,
    Tombstone,
    canonical_claim,
    encode,
)
from ..continuations.retention import RetentionLimits, compactable, plan_retention, tombstone_of
from ..continuations.rules import (
    MAX_RESULT_BODY,
    check_deadline_window,
    check_result,
    check_task_hash,
    check_task_key,
    format_ms,
    parse_deadline_format,
)
from ..continuations.snapshot import build_snapshot, encode_snapshot
from ..continuations.trail import record_change
from ..legacy.migrate import Fence
from ..protocol import paths
from ..protocol.views import detail_body, list_item, status_body
from ..protocol.wire import (
    ClaimRequest,
    ClaimResponse,
    DetachedClaimRequest,
    DetailBody,
    HealthBody,
    HealthCauseBody,
    ListResponse,
    ResultRequest,
    StatusBody,
)
from ..store import Delete, Put, RecordStore, RecordTooLarge, VersionConflict
from ..store.keys import derive_key
from ..wal import TransactionTooLarge
from .binding import ClaimCapability, RunBinding
from .repository import LIVE as LIVE_PREFIX
from .repository import TOMB as TOMB_PREFIX
from .repository import IndexCorrupt, Repository, bounded_batches

__all__ = [
    "CLAIM_CAPABILITY_TTL_MS",
    "ContinuationService",
    "Resolution",
    "ResolutionKind",
    "ServiceHooks",
    "open_payload_store",
    "wall_clock_ms",
]

log = logging.getLogger("afterword.service")

CLAIM_CAPABILITY_TTL_MS = 60 * 60 * 1000
SETTLE_BATCH = 100  # records per settlement/recovery transaction, at most
RECORD_SLACK = 1024  # room per record for the change, the key and the framing
RETENTION_BATCH = 200
PAYLOADS_DIR = "payloads"
PAYLOAD_QUOTA = 1 << 50  # no quota of its own: bounded by the records that reference them
HEALTH_ID_LIMIT = 100  # ids listed per health cause; the count is always exact
ResolutionKind = Literal["delivered", "not_delivered", "dead_lettered"]


def open_payload_store(store: RecordStore) -> BlobStore:
    return BlobStore(
        store.root, store.secret, rel_dir=PAYLOADS_DIR, quota=PAYLOAD_QUOTA, max_blob=MAX_RESULT_BODY
    )


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class ServiceHooks:
    """Explicit test hooks (never set in production): awaited at named points."""

    before_claim_commit: Callable[[], Awaitable[None]] | None = None


@dataclass(frozen=True)
class Resolution:
    kind: ResolutionKind
    delivery_id: str | None = None


class ContinuationService:
    """Durable continuations over one open state directory.

    Use :func:`afterword.open_service` to get one with its HTTP server and worker running.
    """

    def __init__(
        self,
        config: Config,
        store: RecordStore,
        blobs: BlobStore,
        *,
        payloads: BlobStore | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        token_bytes: Callable[[int], bytes] = secrets.token_bytes,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.blobs = blobs
        # Out-of-line result payloads: their own directory, outside the snapshot quota (the
        # admission limits already bound how many results can be live).
        self.payloads = payloads if payloads is not None else open_payload_store(store)
        self.clock_ms = clock_ms
        self._token_bytes = token_bytes
        self._environ = environ if environ is not None else os.environ
        secret = store.secret
        self._k_ids = derive_key(secret, "continuation-ids")
        self._k_result = derive_key(secret, "result-tokens")
        self._k_claim = derive_key(secret, "claim-capabilities")
        self._k_operator = derive_key(secret, "operator")
        self._k_metrics = derive_key(secret, "metrics")
        self._k_host = derive_key(secret, "host")
        self._k_claim_mac = derive_key(secret, "claim-binding")
        self._k_cursor = derive_key(secret, "operator-cursor")
        self.repo = Repository(store)
        # Half the log's transaction bound: whatever a batch's sizing misses still fits.
        self.tx_budget = max(64 * 1024, store.options.wal.max_payload // 2)
        self.fence = Fence(store)
        self.hooks = ServiceHooks()
        self._caps: dict[str, ClaimCapability] = {}
        self._admitting: Counter[str] = Counter()
        self.admitting_total = 0
        self.work_available = anyio.Event()
        self.on_change: list[Callable[[Continuation | None, Continuation], None]] = []

    def _require_enabled(self) -> None:
        if not self.config.enabled:
            raise ServiceDisabled()

    # -- urls and keys -----------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return self.config.base_url

    @property
    def claim_url(self) -> str:
        return paths.url(paths.CLAIM, self.base_url)

    def result_url(self, cid: str) -> str:
        return paths.url(paths.RESULT, self.base_url, cid=cid)

    def status_url(self, cid: str) -> str:
        return paths.url(paths.STATUS, self.base_url, cid=cid)

    def operator_token(self) -> str:
        return operator_token(self._k_operator)

    def verify_operator(self, token: str) -> None:
        if not verify_operator_token(self._k_operator, token):
            raise Unauthorized("operator capability required")

    def verify_host(self, token: str) -> None:
        if not verify_host_token(self._k_host, token):
            raise Unauthorized("host capability required")

    def verify_metrics_reader(self, token: str) -> None:
        """The metrics endpoint opens to the operator or to the read-only metrics capability."""
        if not (verify_operator_token(self._k_operator, token) or verify_metrics_token(self._k_metrics, token)):
            raise Unauthorized("operator or metrics capability required")

    # -- locking -----------------------------------------------------------------------------
    def _locked(self, ids: Iterable[str]) -> AbstractAsyncContextManager[None]:
        # The repository's pool: one lock per continuation id, taken in sorted order.
        return self.repo.locks.hold(ids)

    def _notify(self, old: Continuation | None, new: Continuation) -> None:
        for fn in self.on_change:
            fn(old, new)
        self.work_available.set()

    async def commit(
        self, pairs: Sequence[tuple[Continuation | None, Continuation]], *, extra: Sequence[Any] = ()
    ) -> None:
        """Commit new versions (create when old is None) in one transaction, then notify."""
        now = self.clock_ms()
        pairs = [(old, self._with_history(new, now)) for old, new in pairs]
        creates = [new for old, new in pairs if old is None]
        updates = [new for old, new in pairs if old is not None]
        self.fence.ensure()  # before the first native v3 record becomes durable
        expect: dict[str, int | None] = {}
        for rec in creates:
            expect["c/" + rec.id] = None
        for rec in updates:
            expect["c/" + rec.id] = self.repo.version(rec.id)
        await self.store.transact([*(self.repo.put(r) for r in (*creates, *updates)), *extra], expect=expect)
        for old, new in pairs:
            self._notify(old, new)

    def _with_history(self, new: Continuation, now: int) -> Continuation:
        """``new`` with its state history carried forward, unless that history would be what
        pushes a near-limit record over the store's per-record limit: the history is for
        operators and must never be the reason a transition fails."""
        recorded = record_change(self.repo.get(new.id), new, now)
        limit = self.store.options.max_record_bytes
        if recorded.history and len(recorded.text or "") > limit // 2 and len(encode(recorded)) > limit:
            return msgspec.structs.replace(recorded, history=())
        return recorded

    async def transition(
        self, cid: str, fn: Callable[[Continuation], Continuation | None]
    ) -> tuple[Continuation, bool]:
        """Apply a pure transition to one record under its lock; returns (record, changed)."""
        async with self._locked([cid]):
            rec = self.repo.get(cid)
            if rec is None:
                raise NotFound(f"no continuation {cid}")
            new = fn(rec)
            if new is None or new == rec:
                return rec, False
            await self.commit([(rec, new)])
            return new, True

    # -- claims ------------------------------------------------------------------------------
    def _claim_response(self, rec: Continuation | Tombstone) -> ClaimResponse:
        cid = rec.claim.id
        return ClaimResponse(
            continuation_id=cid,
            result_url=self.result_url(cid),
            status_url=self.status_url(cid),
            result_token=result_token(self._k_result, cid),
            expires_at=format_ms(rec.claim.deadline_ms),
            fingerprint=rec.claim.fingerprint,
        )

    @staticmethod
    def _claim_difference(a: Claim, b: Claim) -> str | None:
        if a.task_hash != b.task_hash:
            return "taskHash"
        if a.deadline_ms != b.deadline_ms:
            return "deadline"
        fields = ("kind", "server_name", "run_id", "conversation_id", "reply_to", "route", "mode")
        if any(getattr(a, f) != getattr(b, f) for f in fields):
            return "binding"
        return None

    async def _admit(self, claim: Claim, origin_context: str, origin: str) -> ClaimResponse:
        async with self._locked([claim.id]):
            existing: Continuation | Tombstone | None = self.repo.get(claim.id) or self.repo.tombstone(
                claim.id
            )
            if existing is not None:
                diff = self._claim_difference(existing.claim, claim)
                if diff is not None:
                    raise Conflict(f"this task key was already claimed with a different {diff}")
                return self._claim_response(existing)  # a repeat: idempotent even past the window
            check_deadline_window(claim.deadline_ms, self.clock_ms())
            limits = self.config.limits
            if self.repo.active_total + self.admitting_total >= limits.max_active_records:
                raise AdmissionLimit("too many active continuations")
            if self.repo.origin_active[origin] + self._admitting[origin] >= limits.max_active_per_origin:
                raise AdmissionLimit("too many active continuations for this origin")
            rec = Continuation(
                claim=claim,
                claim_mac=claim_mac(self._k_claim_mac, claim),
                origin_context=origin_context,  # type: ignore[arg-type]
                updated_at_ms=claim.created_at_ms,
            )
            self._admitting[origin] += 1
            self.admitting_total += 1
            try:
                if self.hooks.before_claim_commit is not None:
                    await self.hooks.before_claim_commit()
                await self.commit([(None, rec)])
            finally:
                self._admitting[origin] -= 1
                self.admitting_total -= 1
                if self._admitting[origin] <= 0:
                    del self._admitting[origin]
            log.info("continuation %s claimed by %s (mode %s)", claim.id, claim.server_name, claim.mode)
            return self._claim_response(rec)

    async def claim(self, token: str, req: ClaimRequest) -> ClaimResponse:
        """A request-bound claim from a selected server during its MCP request."""
        self._require_enabled()
        cap_id = parse_claim_token(self._k_claim, token)
        if cap_id is None:
            raise Unauthorized("a valid claim capability is required")
        cap = self._caps.get(cap_id)
        now = self.clock_ms()
        if cap is None or now > cap.expires_at_ms:
            raise Closed("this claim capability is closed")
        if cap.closed:
            return self._repeat_after_close(cap, req)
        cap.enter()  # no await between the closed check and this: close() waits for us
        try:
            check_task_key(req.task_key)
            check_task_hash(req.task_hash)
            deadline = parse_deadline_format(req.deadline)
            cid = continuation_id(self._k_ids, "interactive", cap.server_name, req.task_key)
            claim = Claim(
                id=cid,
                kind="interactive",
                server_name=cap.server_name,
                run_id=cap.run_id,
                conversation_id=cap.conversation_id,
                reply_to=cap.reply_to,
                route=None,
                mode=cap.mode,  # type: ignore[arg-type]
                task_key=req.task_key,
                task_hash=req.task_hash,
                deadline_ms=deadline,
                fingerprint=cap.fingerprint,
                created_at_ms=now,
            )
            response = await self._admit(claim, "pending", f"run\x00{cap.run_id}\x00{cap.conversation_id}")
            if cid not in cap.claim_ids:
                cap.claim_ids.append(cid)
            return response
        finally:
            cap.leave()

    def _repeat_after_close(self, cap: ClaimCapability, req: ClaimRequest) -> ClaimResponse:
        """A closed capability still answers an identical repeat of a claim it admitted (the
        producer may have lost the first response); anything new is refused."""
        cid = continuation_id(self._k_ids, "interactive", cap.server_name, req.task_key)
        existing: Continuation | Tombstone | None = self.repo.get(cid) or self.repo.tombstone(cid)
        if cid not in cap.claim_ids or existing is None:
            raise Closed("this claim capability is closed")
        if existing.claim.task_hash != req.task_hash:
            raise Conflict("this task key was already claimed with a different taskHash")
        if existing.claim.deadline_ms != parse_deadline_format(req.deadline):
            raise Conflict("this task key was already claimed with a different deadline")
        return self._claim_response(existing)

    def authenticate_claim(self, token: str) -> None:
        """Refuse a claim token that this service never issued, before its body is read."""
        self._require_enabled()
        if parse_claim_token(self._k_claim, token) is None:
            raise Unauthorized("a valid claim capability is required")

    def authenticate_detached(self, service_name: str, token: str) -> None:
        """Refuse an unknown detached service or a wrong token (checked from headers alone)."""
        self._require_enabled()
        service = self.config.detached_services.get(service_name)
        if service is None:
            raise Unauthorized("unknown detached service or wrong token")
        try:
            expected = read_detached_token(self.config, service_name, self._environ)
        except ConfigError:  # its variable is unset or too short: no token can match
            raise Unauthorized("unknown detached service or wrong token") from None
        if not verify_bearer(expected, token):
            raise Unauthorized("unknown detached service or wrong token")

    def authenticate_result(self, cid: str, token: str) -> None:
        """Refuse a result token not minted for ``cid`` (checked before the body is read)."""
        self._check_result_token(cid, token)

    async def detached_claim(self, service_name: str, token: str, req: DetachedClaimRequest) -> ClaimResponse:
        """A claim by a configured detached service on a configured named route."""
        self._require_enabled()
        self.authenticate_detached(service_name, token)
        route = self.config.named_routes.get(req.route)
        if route is None:
            raise Forbidden("route is not a configured named route")
        now = self.clock_ms()
        check_task_key(req.task_key)
        check_task_hash(req.task_hash)
        deadline = parse_deadline_format(req.deadline)
        mode: Mode = route.mode
        claim = Claim(
            id=continuation_id(self._k_ids, "detached", service_name, req.task_key),
            kind="detached",
            server_name=service_name,
            run_id=None,
            conversation_id=route.conversation_id,
            reply_to=route.conversation_id if mode == "notify_if_actionable" else None,
            route=req.route,
            mode=mode,
            task_key=req.task_key,
            task_hash=req.task_hash,
            deadline_ms=deadline,
            fingerprint=fingerprint(None, service_name, route.conversation_id, None, mode, req.route),
            created_at_ms=now,
        )
        return await self._admit(claim, "detached_latest", f"detached\x00{service_name}\x00{req.route}")

    # -- results and status ------------------------------------------------------------------
    def _check_result_token(self, cid: str, token: str) -> None:
        if not verify_result_token(self._k_result, cid, token):
            raise Unauthorized("a valid result token for this continuation is required")

    async def submit_result(self, cid: str, token: str, req: ResultRequest, body_len: int) -> StatusBody:
        self._check_result_token(cid, token)
        canonical = check_result(req.idempotency_key, req.payload_hash, req.payload, body_len)
        async with self._locked([cid]):
            rec = self.repo.get(cid)
            if rec is None:
                tomb = self.repo.tombstone(cid)
                if tomb is None:
                    raise NotFound(f"no continuation {cid}")
                if tomb.idempotency_key == req.idempotency_key and tomb.payload_hash == req.payload_hash:
                    return status_body(tomb)
                if tomb.idempotency_key is None:
                    raise Closed(f"continuation is {tomb.state}")
                raise Conflict("a different result was already accepted for this continuation")
            now = self.clock_ms()
            probe = ResultRecord(
                idempotency_key=req.idempotency_key, payload_hash=req.payload_hash, received_at_ms=now
            )
            if lifecycle.submit_result(rec, probe, now) is None:
                return status_body(rec)  # an identical repeat: nothing to store
            digest = None
            if len(canonical) > INLINE_PAYLOAD_MAX:
                # Out of line, so records stay small (see docs/storage-format.md): written and
                # fsynced before the record that references it commits, pinned until then.
                digest = await anyio.to_thread.run_sync(self.payloads.put, canonical)
            try:
                result = msgspec.structs.replace(
                    probe,
                    payload=b"" if digest is not None else canonical,
                    payload_digest=digest,
                    payload_size=len(canonical) if digest is not None else None,
                )
                new = lifecycle.submit_result(rec, result, now)
                assert new is not None
                await self.commit([(rec, new)])
            finally:
                if digest is not None:
                    self.payloads.unpin(digest)
            log.info("continuation %s result received%s", cid, " (deferred)" if new.deferred else "")
            return status_body(new)

    async def result_payload(self, rec: Continuation) -> bytes:
        """The accepted payload's bytes, inline or read back from the payload blob store and
        checked against both its blake3 name and the accepted payloadHash.

        Raises:
            BlobError: the payload blob is missing or does not match its digests.
        """
        result = rec.result
        if result is None:
            raise InvalidTransition(rec.state, "read result")
        if result.payload_digest is None:
            return result.payload
        data = await anyio.to_thread.run_sync(self.payloads.get, result.payload_digest)
        if hashlib.sha256(data).hexdigest() != result.payload_hash:
            raise BlobCorruptError(f"payload {result.payload_digest}: does not match the accepted payloadHash")
        return data

    def status(self, cid: str, token: str) -> StatusBody:
        self._check_result_token(cid, token)
        rec: Continuation | Tombstone | None = self.repo.get(cid) or self.repo.tombstone(cid)
        if rec is None:
            raise NotFound(f"no continuation {cid}")
        return status_body(rec)

    # -- host side ---------------------------------------------------------------------------
    def begin_run(
        self, run_id: str, conversation_id: str, reply_to: str | None, mode: str = "reply"
    ) -> RunBinding:
        """Issue claim capabilities for one agent run (one per selected server).

        Raises ServiceDisabled when the configuration disables continuations: a host must not
        believe a run can carry continuations that nothing will ever admit.
        """
        self._require_enabled()
        if not run_id or not conversation_id:
            raise InvalidRequest("run_id and conversation_id are required")
        if mode not in MODES:
            raise InvalidRequest(f"unknown delivery mode {mode!r}")
        if mode in ("reply", "notify_if_actionable") and not reply_to:
            raise InvalidRequest(f"mode {mode} needs the physical reply route")
        caps: dict[str, ClaimCapability] = {}
        now = self.clock_ms()
        for server in self.config.continuation_servers:
            cap_id = base64.urlsafe_b64encode(self._token_bytes(18)).decode().rstrip("=")
            cap = ClaimCapability(
                capability_id=cap_id,
                run_id=run_id,
                server_name=server,
                conversation_id=conversation_id,
                reply_to=reply_to,
                mode=mode,
                fingerprint=fingerprint(run_id, server, conversation_id, reply_to, mode),
                token=claim_token(self._k_claim, cap_id),
                expires_at_ms=now + CLAIM_CAPABILITY_TTL_MS,
            )
            caps[server] = cap
            self._caps[cap_id] = cap
        return RunBinding(self, run_id, conversation_id, reply_to, mode, caps)

    def _forget_capabilities(self) -> None:
        """Closed capabilities stay until they expire, to answer lost-response repeats."""
        now = self.clock_ms()
        for cap_id in [k for k, c in self._caps.items() if c.expires_at_ms < now]:
            del self._caps[cap_id]

    def _run_claims(self, binding: RunBinding) -> list[str]:
        ids: list[str] = []
        for cap in binding._caps.values():
            ids.extend(cap.claim_ids)
        return ids

    def _active_claims_of(self, binding: RunBinding) -> list[str]:
        out = []
        for cid in self._run_claims(binding):
            rec = self.repo.get(cid)
            if rec is not None and not rec.terminal:
                out.append(cid)
        return out

    # -- bounded settlement ------------------------------------------------------------------
    # A run may hold hundreds of records of up to 2 MiB each, so no settlement writes them in
    # one transaction: records change in batches bounded by bytes (``tx_budget``), and the
    # group activation marker, committed alone before any record changes, is the commit point
    # that recovery finishes from. A stop between batches leaves a prefix done; recovery (or
    # the next settlement call) completes the rest the same way.
    def _batches(self, ids: Sequence[str]) -> list[list[str]]:
        def size(cid: str) -> int:
            stored = self.store.get(LIVE_PREFIX + cid)
            return (len(stored.value) if stored is not None else 0) + RECORD_SLACK

        return bounded_batches(ids, size, self.tx_budget, SETTLE_BATCH)

    async def _settle_batch(
        self, ids: Sequence[str], fn: Callable[[Continuation], Continuation]
    ) -> list[Continuation]:
        for _attempt in range(5):
            async with self._locked(ids):
                pairs = []
                for cid in ids:
                    rec = self.repo.get(cid)
                    if rec is not None and rec.origin_context == "pending":
                        pairs.append((rec, fn(rec)))
                if not pairs:
                    return []  # nothing pending: settling again must not cost an fsync
                try:
                    await self.commit(pairs)
                except VersionConflict:
                    continue
                return [new for _, new in pairs]
        raise Conflict("origin settlement kept conflicting with concurrent updates")

    def _pending_of(self, binding: RunBinding) -> list[str]:
        out = []
        for cid in self._active_claims_of(binding):
            rec = self.repo.get(cid)
            if rec is not None and rec.origin_context == "pending":
                out.append(cid)
        return out

    async def _update_run(
        self, binding: RunBinding, fn: Callable[[Continuation], Continuation]
    ) -> list[Continuation]:
        out: list[Continuation] = []
        for batch in self._batches(self._pending_of(binding)):
            out.extend(await self._settle_batch(batch, fn))
        return out

    async def _finalize_run(self, binding: RunBinding, history: Sequence[Mapping[str, Any]]) -> str | None:
        pending = self._pending_of(binding)
        if not pending:
            return None
        snapshot = build_snapshot(binding.conversation_id, history)
        binding.history_boundary = snapshot.history_boundary  # type: ignore[attr-defined]
        # The blob write fsyncs twice: keep it off the event loop.
        digest = await anyio.to_thread.run_sync(self.blobs.put, encode_snapshot(snapshot))
        now = self.clock_ms()
        try:
            await self._update_run(
                binding,
                lambda rec: lifecycle.bind_snapshot(
                    rec, digest, self.blobs.bind(digest, canonical_claim(rec.claim)), now
                ),
            )
        finally:
            self.blobs.unpin(digest)
        log.info("run origin snapshot bound to %d continuation(s)", len(pending))
        return digest

    async def _activate_run(self, binding: RunBinding) -> None:
        now = self.clock_ms()
        pending = self._pending_of(binding)
        if not pending:
            return  # nothing pending: activating again must not cost an fsync
        marker = self.repo.activation(binding.run_id)
        if marker is None or not set(pending) <= set(marker.claim_ids):
            act = Activation(
                run_id=binding.run_id,
                conversation_id=binding.conversation_id,
                history_boundary=int(getattr(binding, "history_boundary", 0)),
                activated_at_ms=now,
                claim_ids=tuple(sorted(set(pending) | set(marker.claim_ids if marker else ()))),
            )
            self.fence.ensure()  # the marker may be the first native v3 record
            await self.store.transact([self.repo.activation_put(binding.run_id, act)])
        recs = await self._update_run(binding, lambda rec: lifecycle.activate(rec, now))
        log.info("run origin activated for %d continuation(s)", len(recs))

    async def _abandon_run(self, binding: RunBinding) -> None:
        now = self.clock_ms()
        marker = self.repo.activation(binding.run_id)
        activated = frozenset(marker.claim_ids) if marker is not None else frozenset()

        def settle(rec: Continuation) -> Continuation:
            # Past the commit point an origin is activated, never abandoned: an activation
            # whose materialization was interrupted is finished instead.
            if rec.id in activated:
                return lifecycle.activate(rec, now)
            return lifecycle.abandon(rec, now)

        recs = await self._update_run(binding, settle)
        if recs:
            log.info("run origin abandoned for %d continuation(s)", len(recs))

    # -- recovery ----------------------------------------------------------------------------
    async def recover(self) -> int:
        """Finish what a stop interrupted: settle origins, and turn interrupted synthesis or
        delivery into a non-replayed terminal state. Returns the number of records changed.

        Commits in batches bounded by bytes; a record whose new version the store refuses is
        parked (see :meth:`_park_unwritable`) so that startup always completes."""
        now = self.clock_ms()
        changes: dict[str, tuple[Continuation, Continuation]] = {}
        for rec in self.repo.live():
            new = rec
            if new.origin_context == "pending" and new.claim.kind == "interactive":
                marker = self.repo.activation(new.claim.run_id or "")
                if marker is not None and new.id in marker.claim_ids:
                    new = lifecycle.activate(new, now)
                else:
                    new = lifecycle.abandon(new, now)  # the origin run died before commit
            recovered = lifecycle.recover(new, now)
            if recovered is not None:
                new = recovered
            if new != rec:
                changes[rec.id] = (rec, new)
        for batch in bounded_batches(
            list(changes), lambda cid: len(encode(changes[cid][1])) + RECORD_SLACK, self.tx_budget, SETTLE_BATCH
        ):
            pairs = [changes[cid] for cid in batch]
            try:
                await self.commit(pairs)
            except (RecordTooLarge, TransactionTooLarge):
                for pair in pairs:
                    await self._commit_or_park(pair, now)
        if changes:
            log.info("recovery changed %d continuation(s)", len(changes))
        return len(changes)

    async def _commit_or_park(self, pair: tuple[Continuation, Continuation], now: int) -> None:
        try:
            await self.commit([pair])
        except (RecordTooLarge, TransactionTooLarge):
            await self._park_unwritable(pair[0], now)

    async def _park_unwritable(self, rec: Continuation, now: int) -> None:
        """A record whose next version does not fit the store: end it where an operator sees
        it (dead-lettered, or delivery_unknown if posting may have begun), dropping its
        synthesized text to make room. If even that cannot be written, it is left as it was
        (health lists it) and startup carries on."""
        parked = lifecycle.park(rec, "record_too_large", "the record outgrew the store's per-record limit", now)
        try:
            await self.commit([(rec, parked)])
            log.error("continuation %s parked: its next version exceeds the store's limits", rec.id)
        except (RecordTooLarge, TransactionTooLarge):
            log.error("continuation %s could not be changed (too large); left for an operator", rec.id)

    # -- retention ---------------------------------------------------------------------------
    def retention_limits(self) -> RetentionLimits:
        r = self.config.retention
        return RetentionLimits(
            terminal_max_records=r.terminal_max_records,
            terminal_max_age_ms=r.terminal_max_age_ms,
            captured_text_max_records=r.captured_text_max_records,
            captured_text_max_age_ms=r.captured_text_max_age_ms,
        )

    async def apply_retention(self) -> tuple[int, int, int]:
        """Compact settled records, drop expired tombstones, sweep unreferenced blobs.

        Applied in bounded batches, each one transaction, so a crash leaves a prefix of the
        plan done and the next pass finishes it. Returns (compacted, dropped, blobs swept).
        """
        plan = plan_retention(
            self.repo.live(), self.repo.tombstones(), self.clock_ms(), self.retention_limits()
        )
        dropped_set = set(plan.drop)
        compacted = dropped = 0
        # A tombstone is never larger than its record, so the stored sizes bound each batch.
        for batch in bounded_batches(
            [cid for cid in plan.compact if self.store.get(LIVE_PREFIX + cid) is not None],
            lambda cid: len(self.store.get(LIVE_PREFIX + cid).value) + RECORD_SLACK,  # type: ignore[union-attr]
            self.tx_budget,
            RETENTION_BATCH,
        ):
            async with self._locked(batch):
                mutations: list[Any] = []
                expect: dict[str, int | None] = {}
                for cid in batch:
                    rec = self.repo.get(cid)
                    if rec is None or not compactable(rec):
                        continue  # changed since planning: judged again next pass
                    mutations.append(Delete("c/" + cid))
                    expect["c/" + cid] = self.repo.version(cid)
                    if cid not in dropped_set:
                        mutations.append(Put("t/" + cid, encode(tombstone_of(rec))))
                if mutations:
                    await self.store.transact(mutations, expect=expect)
                    compacted += sum(1 for m in mutations if isinstance(m, Delete))
        for i in range(0, len(plan.drop), RETENTION_BATCH):
            batch = [
                cid for cid in plan.drop[i : i + RETENTION_BATCH] if self.repo.tombstone(cid) is not None
            ]
            if batch:
                await self.store.transact([Delete("t/" + cid) for cid in batch])
                dropped += len(batch)
        # On the loop thread: the referenced set and the sweep must see the same moment, or a
        # blob committed (and unpinned) in between could be judged unreferenced.
        referenced = self.store.referenced_blobs()
        swept = self.blobs.sweep(referenced) + self.payloads.sweep(referenced)
        if compacted or dropped or swept:
            log.info(
                "retention: %d compacted, %d tombstones dropped, %d blobs swept",
                compacted,
                dropped,
                len(swept),
            )
        return compacted, dropped, len(swept)

    # -- operator ----------------------------------------------------------------------------
    def storage_cause(self) -> HealthCauseBody | None:
        """The store's write failure as a health cause (it outranks every record cause)."""
        problem = self.store.storage_problem()
        if problem is None:
            return None
        code, _detail = problem
        doctor = self._doctor_command()
        if code == "storage_full" and self.store.root.failed is None:
            message = "the state directory's file system is full: writes are refused until space is freed"
        elif code == "storage_full":
            message = "a write failed for lack of space: free space, then restart the service"
        else:
            message = "a write or fsync to the state directory failed: fix the disk, then restart the service"
        return HealthCauseBody(code=code, status="unhealthy", count=1, message=message, ids=[], commands=[doctor])

    def _doctor_command(self) -> str:
        return "afterword continuations doctor" + (
            f" --config {shlex.quote(self.config.config_path)}" if self.config.config_path else ""
        )

    def continuation_health(self) -> HealthBody:
        """Health from the current records; each cause names its ids and the command that
        clears it."""
        storage = self.storage_cause()
        try:
            report = assess(
                self.repo.live(),
                self.repo.tombstones(),
                id_limit=HEALTH_ID_LIMIT,
                config_path=self.config.config_path,
            )
        except IndexCorrupt as exc:
            # Health must still answer (and say unhealthy) when the index refuses every read.
            corrupt = HealthCauseBody(
                code="state_corrupt",
                status="unhealthy",
                count=1,
                message="a committed record cannot be indexed: stop the service and check the state",
                ids=[exc.key] if exc.key else [],
                commands=[self._doctor_command()],
            )
            causes = [storage, corrupt] if storage is not None else [corrupt]
            return HealthBody(status="unhealthy", counts={}, history_unrecorded=0, active=0, causes=causes)
        return HealthBody(
            status="unhealthy" if storage is not None else report.status,
            counts=dict(report.counts),
            history_unrecorded=report.history_unrecorded,
            active=report.active,
            causes=([storage] if storage is not None else [])
            + [
                HealthCauseBody(
                    code=c.code,
                    status=c.status,
                    count=c.count,
                    message=c.message,
                    ids=list(c.ids),
                    commands=list(c.commands),
                )
                for c in report.causes
            ],
        )

    def _encode_cursor(self, position: tuple[int, str]) -> str:
        body = base64.urlsafe_b64encode(f"{position[0]}:{position[1]}".encode()).decode().rstrip("=")
        mac = hmac.new(self._k_cursor, body.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{body}.{mac}"

    def _decode_cursor(self, cursor: str) -> tuple[int, str]:
        body, sep, mac = cursor.partition(".")
        expected = hmac.new(self._k_cursor, body.encode(), hashlib.sha256).hexdigest()[:32]
        if not sep or not hmac.compare_digest(expected.encode(), mac.encode()):
            raise InvalidRequest("invalid cursor")
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
            created, cid = raw.split(":", 1)
            return int(created), cid
        except ValueError:
            raise InvalidRequest("invalid cursor") from None

    def list_continuations(
        self,
        limit: int | None = None,
        cursor: str | None = None,
        *,
        state: str | None = None,
        server: str | None = None,
        route: str | None = None,
        newest_first: bool = False,
    ) -> ListResponse:
        """One keyset page, oldest first unless ``newest_first``; ``state``, ``server`` and
        ``route`` keep only records with exactly that value. A cursor is a position in the
        order: pass the same filters and order with it."""
        page_size = self.config.limits.operator_page_size
        if limit is None:
            limit = page_size
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidRequest("limit must be a positive integer")
        if limit > page_size:
            raise InvalidRequest(f"limit may not exceed the configured page size {page_size}")
        if state is not None and state not in STATES:
            raise InvalidRequest("state must be one of " + ", ".join(STATES))
        after = self._decode_cursor(cursor) if cursor else None

        def keep(rec: Continuation | Tombstone) -> bool:
            return (
                (state is None or rec.state == state)
                and (server is None or rec.claim.server_name == server)
                and (route is None or rec.claim.route == route)
            )

        filtered = state is not None or server is not None or route is not None
        items, more = self.repo.page(after, limit, keep=keep if filtered else None, newest_first=newest_first)
        next_cursor = None
        if more and items:
            last = items[-1]
            next_cursor = self._encode_cursor((last.claim.created_at_ms, last.claim.id))
        return ListResponse(items=[list_item(i) for i in items], next_cursor=next_cursor)

    def continuation_detail(self, cid: str) -> DetailBody:
        """One record for ``afterword continuations show``: status, binding names, history."""
        rec: Continuation | Tombstone | None = self.repo.get(cid) or self.repo.tombstone(cid)
        if rec is None:
            raise NotFound(f"no continuation {cid}")
        return detail_body(rec)

    def captured_continuation_text(self, cid: str) -> str | None:
        """The retained text of a delivered capture continuation; None for anything else."""
        rec = self.repo.get(cid)
        if rec is None:
            if self.repo.tombstone(cid) is None:
                raise NotFound(f"no continuation {cid}")
            return None
        if rec.claim.mode != "capture" or rec.state != "delivered":
            return None
        return rec.text

    async def retry_continuation(self, cid: str, allow_unknown: bool = False) -> StatusBody:
        now = self.clock_ms()
        rec, _ = await self.transition(
            cid, lambda r: lifecycle.retry(r, allow_unknown=allow_unknown, now_ms=now)
        )
        log.info("continuation %s retried by operator", cid)
        return status_body(rec)

    async def cancel_continuation(self, cid: str) -> StatusBody:
        now = self.clock_ms()
        if self.repo.get(cid) is None and (tomb := self.repo.tombstone(cid)) is not None:
            if tomb.state == "cancelled":
                return status_body(tomb)
            raise Conflict(f"cancel is not allowed in state {tomb.state}")
        rec, _ = await self.transition(cid, lambda r: lifecycle.cancel(r, now))
        return status_body(rec)

    async def acknowledge_continuation(self, cid: str) -> StatusBody:
        """Record durably that an operator has seen a dead letter, an expiry or a delivery
        missing from history: it stops affecting health and becomes subject to retention.
        Idempotent; an unknown delivery must be resolved instead, active work cancelled."""
        now = self.clock_ms()
        async with self._locked([cid]):
            rec = self.repo.get(cid)
            if rec is None:
                tomb = self.repo.tombstone(cid)
                if tomb is None:
                    raise NotFound(f"no continuation {cid}")
                acked = lifecycle.acknowledge_tombstone(tomb, now)
                if acked is None:
                    return status_body(tomb)
                key = TOMB_PREFIX + cid
                await self.store.transact(
                    [Put(key, encode(acked))], expect={key: self.store.latest_version(key)}
                )
                log.info("continuation %s acknowledged by operator", cid)
                return status_body(acked)
            new = lifecycle.acknowledge(rec, now)
            if new is None:
                return status_body(rec)
            await self.commit([(rec, new)])
        log.info("continuation %s acknowledged by operator", cid)
        return status_body(new)

    async def resolve_continuation_delivery(
        self, cid: str, resolution: Resolution | Mapping[str, Any]
    ) -> StatusBody:
        if isinstance(resolution, Mapping):
            kind = resolution.get("kind")
            if kind not in ("delivered", "not_delivered", "dead_lettered"):
                raise InvalidRequest("resolution kind must be delivered, not_delivered or dead_lettered")
            resolution = Resolution(
                kind=kind, delivery_id=resolution.get("deliveryId") or resolution.get("delivery_id")
            )
        res = resolution
        now = self.clock_ms()
        rec, _ = await self.transition(cid, lambda r: lifecycle.resolve(r, res.kind, res.delivery_id, now))
        if res.kind == "delivered":
            rec = await self.after_resolved_delivered(rec)
        log.info("continuation %s resolved as %s by operator", cid, res.kind)
        return status_body(rec)

    async def after_resolved_delivered(self, rec: Continuation) -> Continuation:
        """History-only commit for an operator-confirmed delivery (overridden by the worker
        composition; by default nothing is recorded and the receipt says so)."""
        return rec

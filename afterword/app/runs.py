"""Runs: the capabilities a host's agent run hands its tool servers, and the settlement of
the run's claims (finalize, activate, abandon) once the run ends.

A run may hold hundreds of records of up to 2 MiB each, so no settlement writes them in one
transaction: records change in batches bounded by bytes (``Ledger.tx_budget``), and the group
activation marker, committed alone before any record changes, is the commit point that
recovery finishes from. A stop between batches leaves a prefix done; recovery (or the next
settlement call) completes the rest the same way.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from ..blobs import BlobStore
from ..config import Config
from ..continuations import lifecycle
from ..continuations.capabilities import fingerprint
from ..continuations.errors import Conflict, InvalidRequest
from ..continuations.model import MODES, Activation, Continuation, Mode, canonical_claim
from ..continuations.snapshot import build_snapshot, encode_snapshot
from ..store import VersionConflict
from .binding import CapabilityRegistry, Finalized, IssuedCapability, RunBinding, RunClaims, TaskAdopter
from .keys import ServiceKeys, ServiceUrls
from .ledger import SETTLE_BATCH, Ledger
from .repository import bounded_batches

log = logging.getLogger("afterword.service")

CLAIM_CAPABILITY_TTL_MS = 60 * 60 * 1000


class Runs:
    """Issues run bindings and settles their claims (the bindings' ``RunSettler``)."""

    def __init__(
        self,
        config: Config,
        ledger: Ledger,
        keys: ServiceKeys,
        urls: ServiceUrls,
        blobs: BlobStore,
        capabilities: CapabilityRegistry,
        token_bytes: Callable[[int], bytes],
        tasks: TaskAdopter | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.repo = ledger.repo
        self.keys = keys
        self.urls = urls
        self.blobs = blobs
        self.capabilities = capabilities
        self.token_bytes = token_bytes
        self.tasks = tasks

    @property
    def claim_url(self) -> str:
        return self.urls.claim_url

    def begin_run(
        self, run_id: str, conversation_id: str, reply_to: str | None, mode: str = "reply"
    ) -> RunBinding:
        """Issue claim capabilities for one agent run (one per selected server)."""
        if not run_id or not conversation_id:
            raise InvalidRequest("run_id and conversation_id are required")
        if mode not in MODES:
            raise InvalidRequest(f"unknown delivery mode {mode!r}")
        checked: Mode = mode
        if checked in ("reply", "notify_if_actionable") and not reply_to:
            raise InvalidRequest(f"mode {mode} needs the physical reply route")
        caps: dict[str, IssuedCapability] = {}
        now = self.ledger.clock_ms()
        # Forgotten here as well as at close: an embedded host that drops bindings without
        # closing them must not grow the registry for as long as the process lives.
        self.capabilities.forget_expired(now)
        for server in self.config.continuation_servers:
            cap_id = base64.urlsafe_b64encode(self.token_bytes(18)).decode().rstrip("=")
            cap = IssuedCapability(
                capability_id=cap_id,
                run_id=run_id,
                server_name=server,
                conversation_id=conversation_id,
                reply_to=reply_to,
                mode=checked,
                fingerprint=fingerprint(run_id, server, conversation_id, reply_to, checked),
                token=self.keys.claim_token(cap_id),
                expires_at_ms=now + CLAIM_CAPABILITY_TTL_MS,
            )
            caps[server] = cap
            self.capabilities.add(cap)
        return RunBinding(self, run_id, conversation_id, reply_to, checked, caps, self.tasks)

    # -- what a binding asks -----------------------------------------------------------------
    def forget_expired(self) -> None:
        self.capabilities.forget_expired(self.ledger.clock_ms())

    def active_claims(self, run: RunClaims) -> list[str]:
        return [cid for cid in run.claim_ids if (rec := self.repo.get(cid)) is not None and not rec.terminal]

    def _pending(self, run: RunClaims) -> list[str]:
        return [
            cid
            for cid in run.claim_ids
            if (rec := self.repo.get(cid)) is not None
            and not rec.terminal
            and rec.origin_context == "pending"
        ]

    async def finalize_run(self, run: RunClaims, history: Sequence[Mapping[str, Any]]) -> Finalized | None:
        pending = self._pending(run)
        if not pending:
            return None
        snapshot = build_snapshot(run.conversation_id, history)
        # The blob write fsyncs twice: keep it off the event loop.
        digest = await anyio.to_thread.run_sync(self.blobs.put, encode_snapshot(snapshot))
        now = self.ledger.clock_ms()
        try:
            await self._update(
                run,
                lambda rec: lifecycle.bind_snapshot(
                    rec, digest, self.blobs.bind(digest, canonical_claim(rec.claim)), now
                ),
            )
        finally:
            self.blobs.unpin(digest)
        log.info("run origin snapshot bound to %d continuation(s)", len(pending))
        return Finalized(digest=digest, history_boundary=snapshot.history_boundary)

    async def activate_run(self, run: RunClaims) -> None:
        now = self.ledger.clock_ms()
        pending = self._pending(run)
        if not pending:
            return  # nothing pending: activating again must not cost an fsync
        marker = self.repo.activation(run.run_id)
        if marker is None or not set(pending) <= set(marker.claim_ids):
            act = Activation(
                run_id=run.run_id,
                conversation_id=run.conversation_id,
                history_boundary=run.history_boundary,
                activated_at_ms=now,
                claim_ids=tuple(sorted(set(pending) | set(marker.claim_ids if marker else ()))),
            )
            self.ledger.rollback_guard.ensure()  # the marker may be the first native v3 record
            await self.ledger.store.transact([self.repo.activation_put(run.run_id, act)])
        recs = await self._update(run, lambda rec: lifecycle.activate(rec, now))
        log.info("run origin activated for %d continuation(s)", len(recs))

    async def abandon_run(self, run: RunClaims) -> None:
        now = self.ledger.clock_ms()
        marker = self.repo.activation(run.run_id)
        activated = frozenset(marker.claim_ids) if marker is not None else frozenset()

        def settle(rec: Continuation) -> Continuation:
            # Past the commit point an origin is activated, never abandoned: an activation
            # whose materialization was interrupted is finished instead.
            if rec.id in activated:
                return lifecycle.activate(rec, now)
            return lifecycle.abandon(rec, now)

        recs = await self._update(run, settle)
        if recs:
            log.info("run origin abandoned for %d continuation(s)", len(recs))

    # -- bounded settlement ------------------------------------------------------------------
    async def _update(self, run: RunClaims, fn: Callable[[Continuation], Continuation]) -> list[Continuation]:
        out: list[Continuation] = []
        batches = bounded_batches(
            self._pending(run), self.ledger.stored_size, self.ledger.tx_budget, SETTLE_BATCH
        )
        for batch in batches:
            out.extend(await self._settle_batch(batch, fn))
        return out

    async def _settle_batch(
        self, ids: Sequence[str], fn: Callable[[Continuation], Continuation]
    ) -> list[Continuation]:
        for _attempt in range(5):
            async with self.ledger.locked(ids):
                pairs = []
                for cid in ids:
                    rec = self.repo.get(cid)
                    if rec is not None and rec.origin_context == "pending":
                        pairs.append((rec, fn(rec)))
                if not pairs:
                    return []  # nothing pending: settling again must not cost an fsync
                try:
                    await self.ledger.commit(pairs)
                except VersionConflict:
                    continue
                return [new for _, new in pairs]
        raise Conflict("origin settlement kept conflicting with concurrent updates")

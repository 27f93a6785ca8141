"""Claims: a tool server's request-bound claim, a detached service's claim, and the checks
that run on headers before a body is read (docs/design.md, Layers)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from ..config import Config, ConfigError
from ..config import detached_token as read_detached_token
from ..continuations.capabilities import continuation_id, fingerprint, verify_bearer
from ..continuations.errors import AdmissionLimit, Closed, Conflict, Forbidden, ServiceDisabled, Unauthorized
from ..continuations.model import Claim, Continuation, Mode, OriginContext, TaskBacking, Tombstone
from ..continuations.rules import (
    check_deadline_window,
    check_task_hash,
    check_task_key,
    format_ms,
    parse_deadline_format,
)
from ..protocol.wire import ClaimRequest, ClaimResponse, DetachedClaimRequest
from .binding import CapabilityRegistry, IssuedCapability
from .keys import ServiceKeys, ServiceUrls
from .ledger import Ledger
from .repository import origin_key

log = logging.getLogger("afterword.service")

DETACHED_REFUSED = "unknown detached service or wrong token"


@dataclass
class ServiceHooks:
    """Explicit test hooks (never set in production): awaited at named points."""

    before_claim_commit: Callable[[], Awaitable[None]] | None = None


def claim_difference(a: Claim, b: Claim) -> str | None:
    """Which part of a repeated claim differs from the one admitted (None: the same claim)."""
    if a.task_hash != b.task_hash:
        return "taskHash"
    if a.deadline_ms != b.deadline_ms:
        return "deadline"
    fields = ("kind", "server_name", "run_id", "conversation_id", "reply_to", "route", "mode")
    if any(getattr(a, f) != getattr(b, f) for f in fields):
        return "binding"
    return None


def bound_claim(
    cap: IssuedCapability, cid: str, *, task_key: str, task_hash: str, deadline_ms: int, now: int
) -> Claim:
    """The claim a run's capability binds: its run, server, origin, reply route and mode, the
    same for a producer's claim and for an adopted MCP task (app/tasks.py)."""
    return Claim(
        id=cid,
        kind="interactive",
        server_name=cap.server_name,
        run_id=cap.run_id,
        conversation_id=cap.conversation_id,
        reply_to=cap.reply_to,
        route=None,
        mode=cap.mode,
        task_key=task_key,
        task_hash=task_hash,
        deadline_ms=deadline_ms,
        fingerprint=cap.fingerprint,
        created_at_ms=now,
    )


class Claims:
    """Admits claims under the configured limits; a repeat of an admitted claim is idempotent."""

    def __init__(
        self,
        config: Config,
        ledger: Ledger,
        keys: ServiceKeys,
        urls: ServiceUrls,
        capabilities: CapabilityRegistry,
        environ: Mapping[str, str],
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.repo = ledger.repo
        self.keys = keys
        self.urls = urls
        self.capabilities = capabilities
        self.environ = environ
        self.hooks = ServiceHooks()
        self.admitting: Counter[str] = Counter()  # by origin: admitted, not yet committed
        self.admitting_total = 0

    def require_enabled(self) -> None:
        if not self.config.enabled:
            raise ServiceDisabled()

    def response(self, rec: Continuation | Tombstone) -> ClaimResponse:
        cid = rec.claim.id
        return ClaimResponse(
            continuation_id=cid,
            result_url=self.urls.result_url(cid),
            status_url=self.urls.status_url(cid),
            result_token=self.keys.result_token(cid),
            expires_at=format_ms(rec.claim.deadline_ms),
            fingerprint=rec.claim.fingerprint,
        )

    async def admit(
        self, claim: Claim, origin_context: OriginContext, task: TaskBacking | None = None
    ) -> ClaimResponse:
        """Admit ``claim`` (with its task backing, for an adopted MCP task)."""
        async with self.ledger.locked([claim.id]):
            existing: Continuation | Tombstone | None = self.repo.get(claim.id) or self.repo.tombstone(
                claim.id
            )
            if existing is not None and task is not None:
                # An adoption repeated concurrently: its deadline was computed at its own time.
                if existing.task is None or existing.task.task_id != task.task_id:
                    raise Conflict("this task was already adopted as a different continuation")
                return self.response(existing)
            if existing is not None:
                diff = claim_difference(existing.claim, claim)
                if diff is not None:
                    raise Conflict(f"this task key was already claimed with a different {diff}")
                return self.response(existing)  # a repeat: idempotent even past the window
            check_deadline_window(claim.deadline_ms, self.ledger.clock_ms())
            rec = Continuation(
                claim=claim,
                claim_mac=self.keys.mac(claim),
                origin_context=origin_context,
                updated_at_ms=claim.created_at_ms,
                task=task,
            )
            origin = origin_key(rec)
            limits = self.config.limits
            if self.repo.active_total + self.admitting_total >= limits.max_active_records:
                raise AdmissionLimit("too many active continuations")
            if self.repo.origin_active[origin] + self.admitting[origin] >= limits.max_active_per_origin:
                raise AdmissionLimit("too many active continuations for this origin")
            self.admitting[origin] += 1
            self.admitting_total += 1
            try:
                if self.hooks.before_claim_commit is not None:
                    await self.hooks.before_claim_commit()
                await self.ledger.commit([(None, rec)])
            finally:
                self.admitting[origin] -= 1
                self.admitting_total -= 1
                if self.admitting[origin] <= 0:
                    del self.admitting[origin]
            log.info("continuation %s claimed by %s (mode %s)", claim.id, claim.server_name, claim.mode)
            return self.response(rec)

    async def claim(self, token: str, req: ClaimRequest) -> ClaimResponse:
        """A request-bound claim from a selected server during its MCP request."""
        self.require_enabled()
        cap_id = self.keys.claim_capability(token)
        if cap_id is None:
            raise Unauthorized("a valid claim capability is required")
        cap = self.capabilities.get(cap_id)
        now = self.ledger.clock_ms()
        if cap is None or now > cap.expires_at_ms:
            raise Closed("this claim capability is closed")
        if cap.closed:
            return self.repeat_after_close(cap, req)
        cap.enter()  # no await between the closed check and this: close() waits for us
        try:
            check_task_key(req.task_key)
            check_task_hash(req.task_hash)
            deadline = parse_deadline_format(req.deadline)
            cid = continuation_id(self.keys.ids, "interactive", cap.server_name, req.task_key)
            claim = bound_claim(
                cap, cid, task_key=req.task_key, task_hash=req.task_hash, deadline_ms=deadline, now=now
            )
            response = await self.admit(claim, "pending")
            if cid not in cap.claim_ids:
                cap.claim_ids.append(cid)
            return response
        finally:
            cap.leave()

    def repeat_after_close(self, cap: IssuedCapability, req: ClaimRequest) -> ClaimResponse:
        """A closed capability still answers an identical repeat of a claim it admitted (the
        producer may have lost the first response); anything new is refused."""
        cid = continuation_id(self.keys.ids, "interactive", cap.server_name, req.task_key)
        existing: Continuation | Tombstone | None = self.repo.get(cid) or self.repo.tombstone(cid)
        if cid not in cap.claim_ids or existing is None:
            raise Closed("this claim capability is closed")
        if existing.claim.task_hash != req.task_hash:
            raise Conflict("this task key was already claimed with a different taskHash")
        if existing.claim.deadline_ms != parse_deadline_format(req.deadline):
            raise Conflict("this task key was already claimed with a different deadline")
        return self.response(existing)

    def authenticate_claim(self, token: str) -> None:
        """Refuse a claim token that this service never issued, before its body is read."""
        self.require_enabled()
        if self.keys.claim_capability(token) is None:
            raise Unauthorized("a valid claim capability is required")

    def authenticate_detached(self, service_name: str, token: str) -> None:
        """Refuse an unknown detached service or a wrong token (checked from headers alone)."""
        self.require_enabled()
        if self.config.detached_services.get(service_name) is None:
            raise Unauthorized(DETACHED_REFUSED)
        try:
            expected = read_detached_token(self.config, service_name, self.environ)
        except ConfigError:  # its variable is unset or too short: no token can match
            raise Unauthorized(DETACHED_REFUSED) from None
        if not verify_bearer(expected, token):
            raise Unauthorized(DETACHED_REFUSED)

    async def detached_claim(self, service_name: str, token: str, req: DetachedClaimRequest) -> ClaimResponse:
        """A claim by a configured detached service on a configured named route."""
        self.require_enabled()
        self.authenticate_detached(service_name, token)
        route = self.config.named_routes.get(req.route)
        if route is None:
            raise Forbidden("route is not a configured named route")
        now = self.ledger.clock_ms()
        check_task_key(req.task_key)
        check_task_hash(req.task_hash)
        deadline = parse_deadline_format(req.deadline)
        mode: Mode = route.mode
        claim = Claim(
            id=continuation_id(self.keys.ids, "detached", service_name, req.task_key),
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
        return await self.admit(claim, "detached_latest")

"""Runs bound through the host API: the app handle's run binding, kept by the service on
behalf of a host in another process, with a lease (see :mod:`afterword.app.leases`).

Every operation goes through the public handle (``begin_run`` and the ``RunBinding``
methods); this module adds only what a remote host needs on top: a run id to find the
binding again, idempotent ``begin``, a per-run lock so two calls on one run serialize, and
the lease.

A run is remembered for as long as the process lives, and for ``SETTLED_MEMORY_MS`` after it
settled (so a host that lost a response can repeat its call). A restarted service forgets
every run; its recovery abandons what was never activated, as for an embedded host.

Memory is bounded by ``continuations.limits.maxOpenRuns``: at most that many runs are open
(begun, not yet activated or abandoned) at once, and at most that many settled runs are
remembered, the oldest settled forgotten first. A hostile or broken host can therefore hold
no more than twice the limit, however fast it begins runs.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from ..continuations.errors import AdmissionLimit, Closed, Conflict, NotFound
from ..continuations.rules import check_host_run, format_ms
from ..protocol.hostapi_wire import AbandonReason, RunBody, RunState, ServerBinding
from ..protocol.tasks import AdoptedTask, TaskHandle
from .leases import lapsed, lease_loop, lease_state

if TYPE_CHECKING:
    from .binding import RunBinding
    from .service import ContinuationService

log = logging.getLogger("afterword.host")

SETTLED_MEMORY_MS = 60 * 60 * 1000  # as long as a closed claim capability answers repeats


class OpenRunsLimit(AdmissionLimit):
    """``continuations.limits.maxOpenRuns`` runs are open: no new run until one settles or
    lapses (HTTP 429 ``admission_limit``, with ``Retry-After``)."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        super().__init__(
            f"{limit} host runs are open (continuations.limits.maxOpenRuns): activate or abandon "
            "one, or let its lease lapse, before beginning another"
        )
        self.retry_after_s = retry_after_s


@dataclass
class HostRun:
    binding: RunBinding
    lease_expires_at_ms: int
    state: RunState = "open"
    abandon_reason: AbandonReason | None = None
    snapshot_digest: str | None = None
    settled_at_ms: int | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    @property
    def settled(self) -> bool:
        return self.state in ("activated", "abandoned")

    def same_binding(self, conversation_id: str, reply_to: str | None, mode: str) -> bool:
        b = self.binding
        return (b.conversation_id, b.reply_to, b.mode) == (conversation_id, reply_to, mode)


class HostRuns:
    """The service's registry of runs begun over the host API."""

    def __init__(self, service: ContinuationService) -> None:
        self._service = service
        self.lease_ms = service.config.limits.run_lease_ms
        self.max_open = service.config.limits.max_open_runs
        self._runs: dict[str, HostRun] = {}
        self._open = 0  # runs in _runs that are not settled
        self._settled: dict[str, None] = {}  # settled run ids, oldest settlement first

    def __repr__(self) -> str:
        return (
            f"<HostRuns open={self._open}/{self.max_open} remembered={len(self._runs)} "
            f"lease_ms={self.lease_ms}>"
        )

    @property
    def open_count(self) -> int:
        return self._open

    def _now(self) -> int:
        return self._service.clock_ms()

    async def begin(self, run_id: str, conversation_id: str, reply_to: str | None, mode: str) -> HostRun:
        """Bind a run; an identical repeat returns the same binding (and renews its lease),
        the same run id with a different binding is a conflict. A new run beyond
        ``maxOpenRuns`` open ones raises :class:`OpenRunsLimit` (a repeat never does)."""
        # Every later call names the run in one URL path segment, and the ids reach logs, the
        # CLI and the status page: bounded and free of control characters, as producer strings.
        check_host_run(run_id, conversation_id, reply_to)
        run = self._runs.get(run_id)
        if run is not None:
            return self._repeat(run, conversation_id, reply_to, mode)
        if self._open >= self.max_open:
            # Lapses the loop has not applied yet free their slots first.
            await self.expire_lapsed()
            run = self._runs.get(run_id)
            if run is not None:  # begun by a concurrent call while we waited
                return self._repeat(run, conversation_id, reply_to, mode)
            if self._open >= self.max_open:
                raise OpenRunsLimit(self.max_open, self._retry_after_s())
        binding = self._service.begin_run(run_id, conversation_id, reply_to, mode)
        run = HostRun(binding=binding, lease_expires_at_ms=self._now() + self.lease_ms)
        self._runs[run_id] = run
        self._open += 1
        log.info("host run %s begun (%d server(s))", run_id, len(binding.servers))
        return run

    def _repeat(self, run: HostRun, conversation_id: str, reply_to: str | None, mode: str) -> HostRun:
        if not run.same_binding(conversation_id, reply_to, mode):
            raise Conflict("this run id was already begun with a different binding")
        if not run.settled:
            run.lease_expires_at_ms = self._now() + self.lease_ms
        return run

    def _retry_after_s(self) -> int:
        """Seconds until the first open lease would lapse if its host stopped calling: the
        earliest a slot can free without a host settling a run."""
        first = min(
            (r.lease_expires_at_ms for r in self._runs.values() if not r.settled),
            default=self._now() + self.lease_ms,
        )
        return max(1, math.ceil((first - self._now()) / 1000))

    def get(self, run_id: str) -> HostRun:
        run = self._runs.get(run_id)
        if run is None:
            raise NotFound(f"no run {run_id} (never begun, or forgotten after a restart)")
        return run

    async def _live(self, run_id: str) -> HostRun:
        """The run, its lapse applied first if due, else its lease renewed: any call on a run
        proves its host alive."""
        run = self.get(run_id)
        if lease_state(run.lease_expires_at_ms, run.settled, self._now()) == "lapsed":
            await self._lapse(run)
        elif not run.settled:
            run.lease_expires_at_ms = self._now() + self.lease_ms
        return run

    @staticmethod
    def _refuse_if_abandoned(run: HostRun) -> None:
        if run.state == "abandoned":
            why = "its lease lapsed" if run.abandon_reason == "lease_lapsed" else "the host abandoned it"
            raise Closed(f"run {run.binding.run_id} was abandoned ({why})")

    async def heartbeat(self, run_id: str) -> HostRun:
        run = await self._live(run_id)
        self._refuse_if_abandoned(run)
        return run

    async def close(self, run_id: str) -> tuple[HostRun, list[str]]:
        run = await self._live(run_id)
        async with run.lock:
            active = await run.binding.close()
            if run.state == "open":
                run.state = "closed"
        return run, active

    async def adopt_task(self, run_id: str, server: str, handle: TaskHandle) -> AdoptedTask:
        """Adopt an MCP task handle in the run (the binding's ``adopt_task``). A settled run
        refuses it (410), a closed one too (409), except an identical repeat."""
        run = await self._live(run_id)
        return await run.binding.adopt_task(server, handle)

    async def finalize(self, run_id: str, history: Sequence[Mapping[str, Any]]) -> HostRun:
        run = await self._live(run_id)
        async with run.lock:
            self._refuse_if_abandoned(run)
            if run.state == "activated":
                raise Closed(f"run {run_id} is already activated")
            run.snapshot_digest = await run.binding.finalize(history)
            run.state = "finalized"
        return run

    async def activate(self, run_id: str) -> HostRun:
        run = await self._live(run_id)
        async with run.lock:
            self._refuse_if_abandoned(run)
            await run.binding.activate()
            self._settle(run, "activated")
        return run

    async def abandon(self, run_id: str) -> HostRun:
        run = await self._live(run_id)
        async with run.lock:
            if not run.settled:  # settlement is final: an activated run stays activated
                await run.binding.abandon()
                self._settle(run, "abandoned", "host")
        return run

    def _settle(self, run: HostRun, state: RunState, reason: AbandonReason | None = None) -> None:
        if not run.settled:
            self._open -= 1
        run.state = state
        run.abandon_reason = reason
        run.settled_at_ms = self._now()
        run_id = run.binding.run_id
        self._settled.pop(run_id, None)
        self._settled[run_id] = None
        while len(self._settled) > self.max_open:
            oldest = next(iter(self._settled))
            del self._settled[oldest]
            self._runs.pop(oldest, None)

    async def _lapse(self, run: HostRun) -> None:
        async with run.lock:
            # Judged again under the lock: a settlement may have finished while we waited.
            if lease_state(run.lease_expires_at_ms, run.settled, self._now()) != "lapsed":
                return
            await run.binding.abandon()
            self._settle(run, "abandoned", "lease_lapsed")
        log.warning("host run %s abandoned: its lease lapsed before activation", run.binding.run_id)

    async def expire_lapsed(self) -> list[str]:
        """Abandon every run whose lease lapsed; forget runs settled long ago. Returns the
        run ids abandoned now."""
        now = self._now()
        due = lapsed(((rid, r.lease_expires_at_ms, r.settled) for rid, r in self._runs.items()), now)
        done = []
        for run_id in due:
            run = self._runs.get(run_id)
            if run is None:
                continue
            try:
                await self._lapse(run)
            except Exception as exc:  # a failing disk must not stop the loop (or the service)
                log.error(
                    "host run %s: abandoning after its lease lapsed failed: %s", run_id, type(exc).__name__
                )
                continue
            if run.abandon_reason == "lease_lapsed":
                done.append(run_id)
        for run_id in [
            rid
            for rid, r in self._runs.items()
            if r.settled_at_ms is not None and now - r.settled_at_ms > SETTLED_MEMORY_MS
        ]:
            del self._runs[run_id]
            self._settled.pop(run_id, None)
        return done

    async def run(self) -> None:
        """The lease loop, until cancelled."""
        await lease_loop(self)

    def body(self, run: HostRun) -> RunBody:
        b = run.binding
        claims = []
        for cid in b.claim_ids:
            try:
                claims.append(self._service.continuation_detail(cid).status)
            except NotFound:
                continue  # dropped by retention long after it ended
        return RunBody(
            run_id=b.run_id,
            conversation_id=b.conversation_id,
            reply_to=b.reply_to,
            mode=b.mode,
            state=run.state,
            abandon_reason=run.abandon_reason,
            servers=[
                ServerBinding(server=s, env=b.stdio_env(s), headers=b.http_headers(s)) for s in b.servers
            ],
            lease_ms=self.lease_ms,
            lease_expires_at=format_ms(run.lease_expires_at_ms),
            snapshot_digest=run.snapshot_digest,
            claims=claims,
        )


_registries: weakref.WeakKeyDictionary[ContinuationService, HostRuns] = weakref.WeakKeyDictionary()


def host_runs(service: ContinuationService) -> HostRuns:
    """The one registry of ``service`` (created on first use)."""
    runs = _registries.get(service)
    if runs is None:
        runs = _registries[service] = HostRuns(service)
    return runs

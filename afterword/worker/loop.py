"""The worker loop: at-most-once synthesis and receipted delivery, within a concurrency bound.

Each continuation is handled by at most one task at a time. Before the model is called the
record is durably ``synthesizing``; before a channel is called it is durably
``delivery_in_flight``. An interruption at either point is therefore visible after a restart
and turns into ``dead_lettered`` or ``delivery_unknown`` rather than a repeat.

The worker sees the app only through the ports it is given
(:class:`afterword.app.ports.WorkerPorts`); the steps live in ``synthesis_step.py`` and
``delivery.py``, the channel choice in ``routes.py``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Mapping

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ..app.ports import WorkerPorts
from ..app.repository import IndexCorrupt
from ..continuations import lifecycle
from ..continuations.actions import next_action
from ..continuations.errors import ContinuationError, InvalidTransition
from ..continuations.model import Continuation
from ..disk import DiskError
from ..history import ConversationHistory
from ..store import VersionConflict
from .channels import Channel
from .delivery import Delivery
from .routes import Routes
from .steps import BindingInvalid, Fallback, Steps
from .synthesis_step import LocalAnswer, Synthesis
from .synthesizers import Synthesizer

__all__ = ["DRAIN_SECONDS", "RETENTION_INTERVAL_S", "SCAN_INTERVAL_S", "BindingInvalid", "Fallback", "Worker"]

log = logging.getLogger("afterword.worker")
SCAN_INTERVAL_S = 1.0
RETENTION_INTERVAL_S = 60.0
DRAIN_SECONDS = 10.0


class Worker(Steps):
    """Schedules each due continuation's next step (``next_action``) on a bounded pool.

    ``ports`` is the app (the service implements :class:`~afterword.app.ports.WorkerPorts`);
    it is read through those methods only. ``history`` receives each delivered answer.
    """

    def __init__(
        self,
        ports: WorkerPorts,
        synthesizer: Synthesizer,
        channels: Mapping[str, Channel],
        history: ConversationHistory | None,
        *,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(ports)
        self.history = history
        routes = Routes(ports, channels)
        self.synthesis = Synthesis(ports, synthesizer, routes, history)
        self.delivery = Delivery(ports, routes, history, jitter)
        self.limiter = anyio.CapacityLimiter(ports.config.limits.max_concurrent)
        self._busy: set[str] = set()
        self._candidates: set[str] = set()
        self._stopping = False
        self._stopped = anyio.Event()
        self._tg: TaskGroup | None = None
        self._retention_running = False
        # Full scans dispatched so far: lets a caller wait for "the worker has looked at every
        # live record since now" instead of guessing how long that takes.
        self.full_scans = 0
        self.retention_interval_s = RETENTION_INTERVAL_S
        self.drain_seconds = DRAIN_SECONDS  # how long stop() lets in-flight work finish
        ports.subscribe(self._on_change)

    @property
    def synthesizer(self) -> Synthesizer:
        return self.synthesis.synthesizer

    @property
    def channels(self) -> Mapping[str, Channel]:
        return self.delivery.routes.channels

    # -- the steps (for hosts and tests that drive the worker themselves) --------------------
    async def synthesize(self, cid: str) -> None:
        """Synthesize ``cid`` if it is due, then deliver the answer."""
        outcome = await self.synthesis.run(cid)
        if isinstance(outcome, LocalAnswer):
            await self.delivery.deliver(cid, answer=outcome.text)
        elif outcome:
            await self.delivery.deliver(cid)

    async def deliver(self, cid: str) -> None:
        await self.delivery.deliver(cid)

    async def reconcile_interrupted(self) -> int:
        return await self.delivery.reconcile_interrupted()

    async def record_history(self, rec: Continuation) -> tuple[bool, str | None]:
        return await self.delivery.record_history(rec)

    # -- scheduling --------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self._candidates) + len(self._busy)

    def _on_change(self, old: Continuation | None, new: Continuation) -> None:
        if new.state in ("result_received", "ready_to_deliver", "delivery_retry"):
            self._candidates.add(new.id)

    def _action(self, rec: Continuation, now: int) -> str | None:
        # The decision is the pure core's (continuations.actions); waits are left to the scan.
        kind = next_action(rec, now).kind
        return None if kind in ("wait", "none") else kind

    def _dispatch(self, tg: TaskGroup, full_scan: bool) -> None:
        now = self.now()
        ids = [r.id for r in self.ports.repo.live()] if full_scan else list(self._candidates)
        self._candidates.clear()
        for cid in ids:
            if cid in self._busy:
                continue
            rec = self.ports.repo.get(cid)
            if rec is None:
                continue
            action = self._action(rec, now)
            if action is not None:
                self._busy.add(cid)
                tg.start_soon(self._run_one, cid, action)

    async def run_due(self, ids: Iterable[str] | None = None) -> list[str]:
        """Run the due action of each record in ``ids`` (default: every live record), one at a
        time and in that order, and return the ids acted on. For hosts and tests that drive the
        worker themselves instead of running :meth:`run` (the order is then reproducible)."""
        now = self.now()
        acted: list[str] = []
        for cid in list(ids) if ids is not None else [r.id for r in self.ports.repo.live()]:
            rec = self.ports.repo.get(cid)
            if rec is None or cid in self._busy:
                continue
            action = self._action(rec, now)
            if action is None:
                continue
            self._busy.add(cid)
            acted.append(cid)
            await self._run_one(cid, action)
        return acted

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            last_scan = 0.0
            last_retention = anyio.current_time()
            corrupt_reported = False
            while not self._stopping:
                if anyio.current_time() - last_retention >= self.retention_interval_s:
                    last_retention = anyio.current_time()
                    tg.start_soon(self._retention)
                self.ports.work_available.clear()
                now = anyio.current_time()
                full = now - last_scan >= SCAN_INTERVAL_S
                if full:
                    last_scan = now
                try:
                    self._dispatch(tg, full)
                    if full:
                        self.full_scans += 1
                except IndexCorrupt as exc:
                    # Fail closed: no work is started from an index that no longer matches
                    # durable state; health and every request report it until a restart.
                    if not corrupt_reported:
                        log.error("worker stopped dispatching: %s", exc)
                        corrupt_reported = True
                await self.ports.work_available.wait(SCAN_INTERVAL_S)
            with anyio.move_on_after(self.drain_seconds):
                while self._busy:
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        self._stopped.set()

    async def _retention(self) -> None:
        if self._retention_running:
            return
        self._retention_running = True
        try:
            await self.ports.apply_retention()
        except (ContinuationError, VersionConflict, DiskError) as exc:
            log.warning("retention pass failed: %s", type(exc).__name__)
        finally:
            self._retention_running = False

    async def stop(self) -> None:
        """Stop taking work, let in-flight work finish within the drain bound."""
        self._stopping = True
        self.ports.work_available.set()
        if self._tg is not None:
            with anyio.move_on_after(self.drain_seconds + 2):
                await self._stopped.wait()

    async def _run_one(self, cid: str, action: str) -> None:
        try:
            async with self.limiter:
                if action == "expire":
                    await self.transition(cid, lambda r: lifecycle.expire(r, self.now()))
                elif action == "synthesize":
                    await self.synthesize(cid)
                elif action == "hold":
                    await self.transition(cid, lambda r: lifecycle.hold_unproven(r, self.now()))
                    log.warning("continuation %s held: its earlier post was never proven", cid)
                else:
                    await self.deliver(cid)
        except (InvalidTransition, VersionConflict) as exc:
            # Someone else (an operator, a concurrent request) changed the record first.
            log.info("continuation %s: %s skipped (%s)", cid, action, type(exc).__name__)
        except ContinuationError as exc:
            log.warning("continuation %s: %s failed: %s", cid, action, exc)
        except DiskError as exc:
            log.error("continuation %s: %s stopped by a storage failure: %s", cid, action, type(exc).__name__)
        except Exception as exc:
            # A malformed record or a bug must not take the worker (and the service) down, nor
            # crash-loop every restart on the same record: park it where an operator sees it.
            log.error("continuation %s: %s failed unexpectedly: %s", cid, action, type(exc).__name__)
            await self._park(cid, type(exc).__name__)
        finally:
            self._busy.discard(cid)
            self.ports.work_available.set()

    async def _park(self, cid: str, reason: str) -> None:
        now = self.now()
        await self.shielded(cid, lambda r: lifecycle.end_after_fault(r, "internal_error", reason, now))

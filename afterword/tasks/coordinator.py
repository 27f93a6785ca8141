"""``ExecutionCoordinator``: wakes an idle session for one turn when a task needs the model.

Per session there is one lock; a turn (user or automatic) holds it. A wake:

1. returns ``busy`` at once if a turn holds the lock - the running turn delivers at its end,
   and the wake is repeated after it;
2. delivers ready notifications (a safe boundary: no turn is running);
3. asks the pure decision (:func:`afterword.tasks.core.continuation_decision`) whether an
   automatic turn may run: not while a tool call waits for its result, not while
   interrupted, not while the goal is paused or blocked, not after model retries ran out,
   and only if a delivered notification waits to be consumed;
4. runs exactly one turn.

:meth:`ExecutionCoordinator.run` is the background loop: it turns journal changes (a terminal
state, a committed tool result) into wakes, repeats wakes that found the session busy, and
schedules a retry after a failed automatic step until the retry limit stops it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import anyio
import anyio.abc
import msgspec
from anyio.streams.memory import MemoryObjectSendStream

from ..history import Message
from . import core
from .journal import TaskJournal
from .notifications import TaskNotifications
from .records import GoalState, SessionControl, TaskRecord
from .turns import TurnOutcome, TurnRunner


class WakeResult(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    ran: bool
    reason: str
    outcome: TurnOutcome | None = None


def default_retry_delay(failures: int) -> float:
    return float(min(2**failures, 60))


class ExecutionCoordinator:
    """Serializes turns per session and drives automatic continuation.

    Args:
        retry_delay: seconds before retrying a failed automatic step, by failure count.
    """

    def __init__(
        self,
        journal: TaskJournal,
        notifications: TaskNotifications,
        runner: TurnRunner,
        *,
        clock: Callable[[], float] = time.time,
        retry_delay: Callable[[int], float] = default_retry_delay,
    ) -> None:
        self.journal = journal
        self.notifications = notifications
        self.runner = runner
        self.clock = clock
        self.retry_delay = retry_delay
        self._locks: dict[str, anyio.Lock] = {}
        self._rewake: set[str] = set()
        self._auto_scopes: dict[str, anyio.CancelScope] = {}
        self._send: MemoryObjectSendStream[str] | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    def _lock(self, session_id: str) -> anyio.Lock:
        return self._locks.setdefault(session_id, anyio.Lock())

    def busy(self, session_id: str) -> bool:
        return self._lock(session_id).locked()

    # -- turns -------------------------------------------------------------------------------
    async def wake(self, session_id: str) -> WakeResult:
        """Deliver what is ready and, if allowed and needed, run exactly one automatic turn."""
        lock = self._lock(session_id)
        if lock.locked():
            self._rewake.add(session_id)
            return WakeResult(session_id=session_id, ran=False, reason="busy")
        async with lock:
            try:
                await self.notifications.deliver(session_id)
                pending = await self.runner.pending(session_id)
                decision = core.continuation_decision(
                    self.journal.control(session_id),
                    busy=False,
                    pending=len(pending),
                    tool_call_open=await self.runner.tool_call_open(session_id),
                )
                if not decision.run:
                    return WakeResult(session_id=session_id, ran=False, reason=decision.reason)
                with anyio.CancelScope() as scope:
                    self._auto_scopes[session_id] = scope
                    outcome = await self.runner.run_turn(session_id)
                    return WakeResult(
                        session_id=session_id, ran=True, reason=decision.reason, outcome=outcome
                    )
                return WakeResult(session_id=session_id, ran=False, reason="interrupted")
            finally:
                self._auto_scopes.pop(session_id, None)
                self._after_turn(session_id)

    async def user_turn(self, session_id: str, message: Message) -> TurnOutcome:
        """Run one turn for new user input (waits for a running turn to finish)."""
        async with self._lock(session_id):
            try:
                return await self.runner.run_turn(session_id, message)
            finally:
                self._after_turn(session_id)

    def _after_turn(self, session_id: str) -> None:
        if session_id in self._rewake:
            self._rewake.discard(session_id)
            self._post(session_id)

    # -- session switches ------------------------------------------------------------------
    async def interrupt(self, session_id: str) -> SessionControl:
        """Stop automatic continuation until new user input; cancels a running automatic step."""
        control = await self.journal.update_control(
            session_id, lambda c: core.interrupted(c, now=self.clock())
        )
        scope = self._auto_scopes.get(session_id)
        if scope is not None:
            scope.cancel()
        return control

    async def set_goal(self, session_id: str, goal: GoalState) -> SessionControl:
        """A paused or blocked goal suppresses automatic continuation; active/none allow it."""
        control = await self.journal.update_control(
            session_id, lambda c: core.goal_set(c, goal, now=self.clock())
        )
        if goal in ("active", "none"):
            self._post(session_id)
        return control

    # -- the background loop -----------------------------------------------------------------
    def _post(self, session_id: str) -> None:
        if self._send is not None:
            self._send.send_nowait(session_id)

    def _on_task_change(self, before: TaskRecord | None, after: TaskRecord | None) -> None:
        if after is None:
            return
        newly_terminal = after.event_id is not None and (before is None or before.event_id is None)
        newly_committed = after.committed and (before is None or not before.committed)
        if newly_terminal or newly_committed:
            self._post(after.session_id)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Wake sessions as tasks end or get committed, until cancelled.

        Every session in the journal is woken once at start, which also delivers (or
        reconciles) notifications a previous life left behind.
        """
        send, receive = anyio.create_memory_object_stream[str](math.inf)
        unsubscribe = self.journal.subscribe(self._on_task_change)
        try:
            async with anyio.create_task_group() as tg, receive:
                self._send, self._tg = send, tg
                for session_id in self.journal.sessions():
                    send.send_nowait(session_id)
                task_status.started()
                async for session_id in receive:
                    tg.start_soon(self._auto, session_id)
        finally:
            unsubscribe()
            self._send, self._tg = None, None
            send.close()

    async def _auto(self, session_id: str) -> None:
        result = await self.wake(session_id)
        if result.outcome is None or result.outcome.succeeded:
            return
        control = self.journal.control(session_id)
        if not control.awaiting_user and self._tg is not None:
            self._tg.start_soon(self._retry_later, session_id, self.retry_delay(control.model_failures))

    async def _retry_later(self, session_id: str, delay: float) -> None:
        await anyio.sleep(delay)
        self._post(session_id)

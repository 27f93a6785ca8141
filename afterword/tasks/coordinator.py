"""``ExecutionCoordinator``: every model step of a session, one at a time, and the tool loop.

Every model step - a user's turn, the continuation after tool results, an automatic wake -
runs under the session's step lock (:meth:`TurnRunner.lock`), held for a whole turn:

    model step -> tool calls? -> run them (the host's :class:`ToolExecutor`) -> commit the
    results -> model step -> ... until the model answers without a tool call.

:meth:`ExecutionCoordinator.user_turn` runs a turn for user input; hosts with a tool loop of
their own hold the lock through :meth:`ExecutionCoordinator.turn` instead. A wake:

1. returns ``busy`` at once if a turn holds the lock - the running turn delivers at its end,
   and the wake is repeated after it;
2. delivers ready notifications (a safe boundary: no turn is running);
3. asks the pure decision (:func:`afterword.tasks.core.continuation_decision`) whether an
   automatic turn may run: not while a tool call waits for its result, not while
   interrupted, not while the goal is paused or blocked, not after model retries ran out,
   and only if a delivered notification waits to be consumed;
4. runs exactly one turn, tool loop included, so its tool calls are answered like a user
   turn's and never stay open.

:meth:`ExecutionCoordinator.run` is the background loop: it turns journal changes (a terminal
state, a committed tool result) into wakes - one per session per short window, so ends that
arrive together are one turn - repeats wakes that found the session busy, schedules a retry
after a failed automatic step until the retry limit stops it, and tells the host what it did
(``on_event``: automatic turns, new notifications, sessions that cannot advance).

Answering the calls - the tool's result or a stand-in, never an open call - is
:class:`~afterword.tasks.answers.ToolAnswers`; a turn the host drives itself is a
:class:`~afterword.tasks.hostturn.HostTurn`.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import msgspec
from anyio.streams.memory import MemoryObjectSendStream

from ..history import Message, ToolCall, open_tool_calls
from . import core
from .answers import ROUND_LIMIT_TOOL_RESULT, ToolAnswers
from .compaction import Compaction
from .events import STALLED_REASONS, EventSink, SessionEvent, emit
from .hostturn import HostTurn
from .journal import TaskJournal
from .notifications import TaskNotifications
from .records import GoalState, SessionControl, TaskRecord
from .toolcalls import ToolCallProcessor
from .toolloop import ToolExecutor, TurnResult
from .turns import TurnOutcome, TurnRunner

DEFAULT_MAX_TOOL_ROUNDS = 16
# Tasks of one session often end together (a batch of tests, a build fanning out): the first
# end opens a window this long, and everything that ends within it is one automatic turn.
DEFAULT_COALESCE_WINDOW = 0.1


class WakeResult(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    ran: bool
    reason: str
    outcome: TurnResult | None = None


def default_retry_delay(failures: int) -> float:
    return float(min(2**failures, 60))


class ExecutionCoordinator:
    """Serializes model steps per session, runs the tool loop and drives automatic continuation.

    Args:
        tools: the host's tool executor; without one, a turn stops at the first tool call and
            returns it in ``TurnResult.open_calls`` for the host to answer.
        processor: commits tool results (one over the runner's history by default).
        max_tool_rounds: tool rounds one turn may run; at the limit the calls of the last
            step are answered as not run and the turn ends (``TurnResult.stopped``).
        retry_delay: seconds before retrying a failed automatic step, by failure count.
        on_event: the host's callback for automatic turns, new notifications and stalled
            sessions (see :class:`SessionEvent`); it must not block.
        coalesce_window: seconds the background loop waits after a session's first change
            before waking it, so ends that arrive together are handled by one turn.
        sleep: how the loop waits out that window and a retry's delay (injected by tests to
            step it, or to see that no wake is on its way).
    """

    def __init__(
        self,
        journal: TaskJournal,
        notifications: TaskNotifications,
        runner: TurnRunner,
        *,
        tools: ToolExecutor | None = None,
        processor: ToolCallProcessor | None = None,
        max_tool_rounds: int = DEFAULT_MAX_TOOL_ROUNDS,
        clock: Callable[[], float] = time.time,
        retry_delay: Callable[[int], float] = default_retry_delay,
        on_event: EventSink | None = None,
        coalesce_window: float = DEFAULT_COALESCE_WINDOW,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.journal = journal
        self.notifications = notifications
        self.runner = runner
        self.tools = tools
        self.processor = processor or ToolCallProcessor(journal, runner.history, clock=clock)
        self.answers = ToolAnswers(self.processor)
        self.max_tool_rounds = max_tool_rounds
        self.clock = clock
        self.retry_delay = retry_delay
        self.on_event = on_event
        self.coalesce_window = coalesce_window
        self._sleep = sleep
        self._gathering: set[str] = set()
        notifications.on_delivered = self._on_delivered
        self._rewake: set[str] = set()
        self._auto_scopes: dict[str, anyio.CancelScope] = {}
        self._send: MemoryObjectSendStream[str] | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    def busy(self, session_id: str) -> bool:
        return self.runner.busy(session_id)

    # -- turns -------------------------------------------------------------------------------
    async def wake(self, session_id: str) -> WakeResult:
        """Deliver what is ready and, if allowed and needed, run exactly one automatic turn."""
        lock = self.runner.lock(session_id)
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
                    outcome = await self._turn(session_id, None)
                    return WakeResult(
                        session_id=session_id, ran=True, reason=decision.reason, outcome=outcome
                    )
                return WakeResult(session_id=session_id, ran=False, reason="interrupted")
            finally:
                self._auto_scopes.pop(session_id, None)
                self._after_turn(session_id)

    async def user_turn(self, session_id: str, message: Message) -> TurnResult:
        """Run one turn for new user input, tool loop included (waits for a running turn)."""
        if message.role != "user":
            raise ValueError("user_message must have role 'user'")
        async with self.runner.lock(session_id):
            try:
                return await self._turn(session_id, message)
            finally:
                self._after_turn(session_id)

    @asynccontextmanager
    async def turn(self, session_id: str) -> AsyncIterator[HostTurn]:
        """Hold the session for a turn the host drives itself (its own tool loop).

        No other model step of the session - automatic or not - runs until the block ends::

            async with coordinator.turn(session) as turn:
                outcome = await turn.step(user_message)
                ...run the tools, then turn.commit_tool_result(...) for each...
                outcome = await turn.step()
        """
        async with self.runner.lock(session_id):
            try:
                host = HostTurn(
                    session_id,
                    runner=self.runner,
                    processor=self.processor,
                    compaction=Compaction(self.journal, self.notifications.history),
                )
                yield host
                await self._settle(host.steps)
            finally:
                self._after_turn(session_id)

    async def _settle(self, steps: Sequence[TurnOutcome]) -> tuple[str, ...]:
        """Consumption belongs to the turn: what any step saw is handled only if the turn's
        last step succeeded; otherwise every seen task keeps the error (invariant 5)."""
        if not steps:
            return ()
        seen = list(dict.fromkeys(t for s in steps for t in s.seen))
        last = steps[-1]
        if last.succeeded:
            return tuple(t.task_id for t in await self.runner.hook.succeeded(seen))
        await self.runner.hook.failed(seen, last.error or "the turn's last model step failed")
        return ()

    async def _turn(self, session_id: str, user_message: Message | None) -> TurnResult:
        if self.tools is None:
            return await self._loop(session_id, user_message)
        # Durable marker: tool calls this turn opens are this coordinator's to answer, also
        # after a crash (see close_open_calls).
        await self.journal.update_control(session_id, lambda c: core.turn_began(c, now=self.clock()))
        try:
            return await self._loop(session_id, user_message)
        finally:
            with anyio.CancelScope(shield=True):
                await self.journal.update_control(session_id, lambda c: core.turn_ended(c, now=self.clock()))

    async def _loop(self, session_id: str, user_message: Message | None) -> TurnResult:
        steps = [await self.runner.step(session_id, user_message, consume=False)]
        results: list[Message] = []
        open_calls: list[ToolCall] = []
        stopped: str | None = None
        while steps[-1].succeeded:
            open_calls = await self._unanswered(session_id, steps[-1])
            if not open_calls or self.tools is None:
                break
            if len(steps) > self.max_tool_rounds:
                # A call left open would block every later step of the session: close them.
                with anyio.CancelScope(shield=True):
                    limit = ROUND_LIMIT_TOOL_RESULT.format(limit=self.max_tool_rounds)
                    for call in open_calls:
                        results.append(await self.answers.stand_in(session_id, call, limit))
                open_calls, stopped = [], "max_tool_rounds"
                break
            results += await self.answers.run(self.tools, session_id, open_calls)
            open_calls = []
            steps.append(await self.runner.step(session_id, None, consume=False))
        consumed = await self._settle(steps)
        return TurnResult(
            session_id=session_id,
            steps=tuple(steps),
            tool_results=tuple(results),
            open_calls=tuple(open_calls),
            stopped=stopped,
            consumed=consumed,
        )

    async def _unanswered(self, session_id: str, outcome: TurnOutcome) -> list[ToolCall]:
        window = await self.runner.history.latest(session_id, self.runner.context_limit)
        still_open = open_tool_calls(window)
        return [c for reply in outcome.replies for c in reply.calls() if c.id in still_open]

    async def close_open_calls(self, session_id: str) -> list[Message]:
        """Answer tool calls a turn of this coordinator left open when it crashed (recovery):
        an open call would block every later step. Only sessions whose control record says a
        turn was running are touched; other writers' conversations are not ours to close."""
        async with self.runner.lock(session_id):
            if not self.journal.control(session_id).turn_open:
                return []
            window = await self.runner.history.latest(session_id, self.runner.context_limit)
            still_open = open_tool_calls(window)
            calls = [c for m in window for c in m.calls() if c.id in still_open]
            messages = [await self.answers.stand_in(session_id, c) for c in calls]
            await self.journal.update_control(session_id, lambda c: core.turn_ended(c, now=self.clock()))
            return messages

    def _on_delivered(self, session_id: str, messages: Sequence[Message]) -> None:
        emit(
            self.on_event, SessionEvent(session_id=session_id, kind="notifications", messages=tuple(messages))
        )

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
                    if session_id not in self._gathering:  # else it joins the waiting wake
                        self._gathering.add(session_id)
                        tg.start_soon(self._coalesced, session_id)
        finally:
            unsubscribe()
            self._send, self._tg = None, None
            send.close()

    async def _coalesced(self, session_id: str) -> None:
        """Wake ``session_id`` once its window has passed; posts meanwhile add nothing."""
        try:
            await self._sleep(self.coalesce_window)
        finally:
            self._gathering.discard(session_id)  # a change from now on opens a new window
        await self._auto(session_id)

    async def _auto(self, session_id: str) -> None:
        result = await self.wake(session_id)
        if result.outcome is not None:
            emit(
                self.on_event,
                SessionEvent(
                    session_id=session_id, kind="automatic_turn", reason=result.reason, turn=result.outcome
                ),
            )
        elif result.reason in STALLED_REASONS:
            emit(self.on_event, SessionEvent(session_id=session_id, kind="stalled", reason=result.reason))
        if result.outcome is None or result.outcome.succeeded:
            return
        control = self.journal.control(session_id)
        if control.awaiting_user:
            emit(
                self.on_event, SessionEvent(session_id=session_id, kind="stalled", reason="retries_exhausted")
            )
        elif self._tg is not None:
            self._tg.start_soon(self._retry_later, session_id, self.retry_delay(control.model_failures))

    async def _retry_later(self, session_id: str, delay: float) -> None:
        await self._sleep(delay)
        self._post(session_id)

"""The turn boundary: when the model has *handled* a task, not merely been shown it.

``TaskTurnHook`` is the piece a host with its own turn loop calls: ask which task facts the
context shows (:meth:`TaskTurnHook.seen`) before the model step, then report the step's
success or failure. ``TurnRunner`` is a complete single-step runner built on it: it delivers
ready notifications at the boundary before the step, reads the context since the latest
compaction handoff, calls the model, appends the replies, marks what the model saw
``consumed``, and delivers again at the boundary after the step.

Model steps of one session never overlap: every step runs under the session's step lock
(:meth:`TurnRunner.lock`). :meth:`TurnRunner.run_turn` takes it for one step; the
``ExecutionCoordinator`` holds it for a whole turn (model, tools, model ...) and calls
:meth:`TurnRunner.step` inside.

``delivered`` proves only that a notification is in the session. ``consumed`` is written after
the model step succeeded and its replies are durable. A failed step leaves the tasks
unconsumed with ``continuation_error`` set, so a later turn or a compaction still carries them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from ..history import ConversationHistory, Message, open_tool_calls
from ..store import KeyedLocks, KeyLock
from . import core
from .journal import TaskJournal
from .notifications import TaskNotifications
from .records import TaskRecord

ModelStep = Callable[[str, Sequence[Message]], Awaitable[Sequence[Message]]]
"""``(session_id, context) -> reply messages``; raising means the model step failed."""

DEFAULT_CONTEXT_LIMIT = 200
DEFAULT_MAX_MODEL_FAILURES = 3
MAX_ERROR_CHARS = 500


class TurnOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What one model step did."""

    session_id: str
    succeeded: bool
    replies: tuple[Message, ...] = ()  # what the model produced, as appended
    seen: tuple[str, ...] = ()  # task ids whose terminal facts were in the context
    consumed: tuple[str, ...] = ()
    delivered: tuple[str, ...] = ()  # notifications written at this turn's boundaries
    error: str | None = None


def describe_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text[:MAX_ERROR_CHARS]


class TaskTurnHook:
    """Marks tasks consumed after a successful model step, or keeps them with the error."""

    def __init__(self, journal: TaskJournal, *, clock: Callable[[], float] = time.time) -> None:
        self.journal = journal
        self.clock = clock

    def seen(self, session_id: str, context: Sequence[Message]) -> list[TaskRecord]:
        """Tasks whose terminal fact ``context`` shows and that still need consumption."""
        return core.seen_in_context(self.journal.tasks(session_id), context)

    async def succeeded(self, task_ids: Sequence[str]) -> list[TaskRecord]:
        if not task_ids:
            return []
        now = self.clock()
        return await self.journal.update_many(task_ids, lambda t: core.consumed(t, now=now))

    async def failed(self, task_ids: Sequence[str], error: str) -> list[TaskRecord]:
        if not task_ids:
            return []
        return await self.journal.update_many(task_ids, lambda t: core.continuation_failed(t, error=error))


def context_since_handoff(window: Sequence[Message]) -> list[Message]:
    """The model's context: everything from the latest compaction handoff on, without tool
    results whose call is not in it (cut off by the window, or by a handoff an older version
    wrote between a call and its result): providers reject a result without its call."""
    start = 0
    for index in range(len(window) - 1, -1, -1):
        if window[index].meta.get("kind") == core.HANDOFF_KIND:
            start = index
            break
    opened: set[str] = set()
    context: list[Message] = []
    for message in window[start:]:
        if message.role == "tool" and message.tool_call_id not in opened:
            continue
        opened.update(message.call_ids())
        context.append(message)
    return context


class TurnRunner:
    """Runs one model step for a session with the task journal's bookkeeping around it."""

    def __init__(
        self,
        history: ConversationHistory,
        journal: TaskJournal,
        notifications: TaskNotifications,
        model_step: ModelStep,
        *,
        clock: Callable[[], float] = time.time,
        context_limit: int = DEFAULT_CONTEXT_LIMIT,
        max_model_failures: int = DEFAULT_MAX_MODEL_FAILURES,
    ) -> None:
        self.history = history
        self.journal = journal
        self.notifications = notifications
        self.model_step = model_step
        self.clock = clock
        self.context_limit = context_limit
        self.max_model_failures = max_model_failures
        self.hook = TaskTurnHook(journal, clock=clock)
        self._locks = KeyedLocks()

    def lock(self, session_id: str) -> KeyLock:
        """The session's step lock: whoever holds it is the only one running model steps."""
        return self._locks.lock(session_id)

    def busy(self, session_id: str) -> bool:
        return self._locks.locked(session_id)

    async def context(self, session_id: str) -> list[Message]:
        return context_since_handoff(await self.history.latest(session_id, self.context_limit))

    async def pending(self, session_id: str) -> list[TaskRecord]:
        """Delivered notifications the model can see and has not handled yet.

        Tasks whose end a tool result reported are consumed by whichever step sees that result,
        but never call for an automatic turn of their own: the host's tool loop owns that step.
        """
        return [t for t in self.hook.seen(session_id, await self.context(session_id)) if t.delivered]

    async def tool_call_open(self, session_id: str) -> bool:
        """Whether the conversation has a tool call still waiting for its result."""
        return bool(open_tool_calls(await self.history.latest(session_id, self.context_limit)))

    async def run_turn(self, session_id: str, user_message: Message | None = None) -> TurnOutcome:
        """One model step under the session's step lock (waits for a running step or turn)."""
        async with self.lock(session_id):
            return await self.step(session_id, user_message)

    async def step(
        self, session_id: str, user_message: Message | None = None, *, consume: bool = True
    ) -> TurnOutcome:
        """One model step; the caller holds :meth:`lock`. New user input lifts interruption
        and the retry stop first.

        ``consume=False``: the step is one of several in a turn; what it saw is consumed by
        the turn's caller once the turn's last step succeeded (:meth:`TaskTurnHook.succeeded`),
        not here - a notification is handled only when the whole answer to it is.
        """
        if not self.lock(session_id).locked():
            raise RuntimeError("TurnRunner.step needs the session's step lock; use run_turn")
        delivered = [t.task_id for t in await self.notifications.deliver(session_id)]
        if user_message is not None:
            if user_message.role != "user":
                raise ValueError("user_message must have role 'user'")
            await self.history.append(session_id, [user_message])
            await self.journal.update_control(session_id, lambda c: core.user_input(c, now=self.clock()))
        context = await self.context(session_id)
        seen = [t.task_id for t in self.hook.seen(session_id, context)]
        try:
            replies = tuple(await self.model_step(session_id, context))
            await self.history.append(session_id, list(replies))
        except Exception as exc:  # the model or its reply failed; cancellation propagates
            error = describe_error(exc)
            await self.hook.failed(seen, error)
            await self._finished(session_id, error)
            return TurnOutcome(
                session_id=session_id,
                succeeded=False,
                seen=tuple(seen),
                delivered=tuple(delivered),
                error=error,
            )
        consumed = [t.task_id for t in await self.hook.succeeded(seen)] if consume else []
        await self._finished(session_id, None)
        delivered += [t.task_id for t in await self.notifications.deliver(session_id)]
        return TurnOutcome(
            session_id=session_id,
            succeeded=True,
            replies=replies,
            seen=tuple(seen),
            consumed=tuple(consumed),
            delivered=tuple(delivered),
        )

    async def _finished(self, session_id: str, error: str | None) -> None:
        await self.journal.update_control(
            session_id,
            lambda c: core.turn_finished(
                c, error=error, max_model_failures=self.max_model_failures, now=self.clock()
            ),
        )

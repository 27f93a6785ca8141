"""``TaskNotifications``: put eligible terminal facts into the session, once, at a safe boundary.

Order of effects, each durable before the next:

1. the notification message is appended to the conversation history (idempotent by its id,
   which derives from the task's event id);
2. the task is marked ``delivered`` with that message id.

A crash between 1 and 2 leaves a message that the journal does not know about yet;
:meth:`TaskNotifications.reconcile` finds it by the same derived id and marks it delivered
without writing it again, and a plain retry of step 1 is a no-op for the same reason.

A notification is only written while the session's tool-call pairing is closed: a message
between an assistant's tool call and its tool result would corrupt the conversation. The check
and the append are one ordered step of the history (:meth:`DurableHistory.append_at_boundary`),
which counts messages other writers have reserved but not yet made durable.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from ..history import BoundaryHistory, Message
from ..store import KeyedLocks
from . import core
from .journal import TaskJournal
from .records import TaskRecord
from .render import render_notification

FaultHook = Callable[[str], Awaitable[None]]
"""Test hook: awaited with a point name (``notification_persisted``) between two effects."""

DEFAULT_EXCERPT_BYTES = 4096
DEFAULT_PAIRING_WINDOW = 256


class TaskNotifications:
    """Delivers task notifications into conversations.

    Args:
        excerpt_bytes: how much of the output tail a notification quotes.
        pairing_window: how many recent messages are read to check tool-call pairing.
        fault: optional test hook, see :data:`FaultHook`.
    """

    def __init__(
        self,
        journal: TaskJournal,
        history: BoundaryHistory,
        *,
        clock: Callable[[], float] = time.time,
        excerpt_bytes: int = DEFAULT_EXCERPT_BYTES,
        pairing_window: int = DEFAULT_PAIRING_WINDOW,
        fault: FaultHook | None = None,
    ) -> None:
        self.journal = journal
        self.history = history
        self.clock = clock
        self.excerpt_bytes = excerpt_bytes
        self.pairing_window = pairing_window
        self.fault = fault
        # Told of every notification written (the coordinator passes it on to the host).
        self.on_delivered: Callable[[str, Sequence[Message]], None] | None = None
        self._locks = KeyedLocks()

    async def deliver(self, session_id: str) -> list[TaskRecord]:
        """Deliver every eligible notification of the session now, if the pairing is closed.

        Returns the tasks marked delivered by this call (including reconciled ones).
        """
        async with self._locks.lock(session_id):
            done = await self._reconcile(session_id)
            ready = core.deliverable(self.journal.tasks(session_id), set())
            if not ready:
                return done
            messages = [
                render_notification(t, self.journal.read_output_tail(t, self.excerpt_bytes)) for t in ready
            ]
            # The pairing check and the append are one step in the history, which also sees
            # appends reserved but not yet durable (an assistant's tool call being written).
            if not await self.history.append_at_boundary(session_id, messages, window=self.pairing_window):
                return done
            if self.fault is not None:
                await self.fault("notification_persisted")
            marked = await self._mark_delivered([t.task_id for t in ready])
            if self.on_delivered is not None:
                self.on_delivered(session_id, messages)
            return done + marked

    async def deliver_all(self) -> list[TaskRecord]:
        """:meth:`deliver` for every session in the journal (startup, periodic sweeps)."""
        out: list[TaskRecord] = []
        for session_id in self.journal.sessions():
            out += await self.deliver(session_id)
        return out

    async def reconcile(self, session_id: str | None = None) -> list[TaskRecord]:
        """Mark delivered every task whose notification is already in the history.

        This is the recovery step for a crash between writing the message and acknowledging
        it: the stable id finds the message, and nothing is written to the conversation.
        """
        sessions = [session_id] if session_id is not None else self.journal.sessions()
        out: list[TaskRecord] = []
        for sid in sessions:
            async with self._locks.lock(sid):
                out += await self._reconcile(sid)
        return out

    async def _reconcile(self, session_id: str) -> list[TaskRecord]:
        found = [
            t.task_id
            for t in self.journal.tasks(session_id)
            if t.event_id is not None
            and not t.delivered
            and self.history.has_message(session_id, core.notification_id_for(t.event_id))
        ]
        return await self._mark_delivered(found) if found else []

    async def _mark_delivered(self, task_ids: list[str]) -> list[TaskRecord]:
        now = self.clock()

        def mark(task: TaskRecord) -> TaskRecord:
            assert task.event_id is not None
            return core.delivered(task, notification_id=core.notification_id_for(task.event_id), now=now)

        return await self.journal.update_many(task_ids, mark)

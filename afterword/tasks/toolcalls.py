"""``ToolCallProcessor``: commits the initial tool result and records that it is committed.

Order of effects, each durable before the next:

1. prepare: each task started by the tool call records the result's message id and whether
   the result hands it off to the background or already reports its terminal state;
2. the tool result message is appended to the conversation history (idempotent by id);
3. commit: the tasks are marked ``committed``.

A crash after 1 leaves the decision in the journal, so :meth:`ToolCallProcessor.recover`
completes step 3 for every result already in the history. A crash before 2 leaves the tool
call open in the conversation; no notification can pass an open call, and the host's retry of
the same result finds the same prepared decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from ..history import ConversationHistory, Message
from . import core
from .journal import TaskJournal
from .notifications import FaultHook
from .records import TaskRecord


class ToolCallProcessor:
    """Writes initial tool results for calls that started background tasks."""

    def __init__(
        self,
        journal: TaskJournal,
        history: ConversationHistory,
        *,
        clock: Callable[[], float] = time.time,
        fault: FaultHook | None = None,
    ) -> None:
        self.journal = journal
        self.history = history
        self.clock = clock
        self.fault = fault

    def tasks_of_call(self, session_id: str, tool_call_id: str) -> list[TaskRecord]:
        return [t for t in self.journal.tasks(session_id) if t.tool_call_id == tool_call_id]

    async def commit_tool_result(
        self, session_id: str, result: Message, *, reported_terminal: Collection[str] = ()
    ) -> list[TaskRecord]:
        """Commit ``result`` (a tool message) and mark the tasks its call started committed.

        Args:
            reported_terminal: ids of tasks whose terminal state ``result`` itself tells the
                model (the tool waited and the process had ended). They are not handed off
                and never get a separate completion notification.
        """
        if result.role != "tool" or result.tool_call_id is None:
            raise ValueError("the initial tool result must be a tool message with tool_call_id")
        tasks = self.tasks_of_call(session_id, result.tool_call_id)
        unknown = set(reported_terminal) - {t.task_id for t in tasks}
        if unknown:
            raise ValueError(f"reported tasks {sorted(unknown)} were not started by this tool call")
        ids = [t.task_id for t in tasks]
        if ids:
            await self.journal.update_many(
                ids,
                lambda t: core.prepare_commit(
                    t, tool_result_id=result.id, reported_terminal=t.task_id in reported_terminal
                ),
            )
        await self.history.append(session_id, [result])
        if self.fault is not None:
            await self.fault("tool_result_persisted")
        if not ids:
            return []
        now = self.clock()
        return await self.journal.update_many(ids, lambda t: core.commit(t, now=now))

    async def commit_interrupted(self, session_id: str, result: Message) -> list[TaskRecord]:
        """Answer a call whose own result never reached the conversation with ``result`` (a
        stand-in saying it was interrupted).

        A decision prepared for the lost result is replaced: the stand-in hands every task of
        the call off, so a task whose end the lost result would have reported is notified
        instead of being marked as told. If the call's result did land (a crash between the
        append and the commit), it is kept and only marked committed.
        """
        if result.role != "tool" or result.tool_call_id is None:
            raise ValueError("the stand-in result must be a tool message with tool_call_id")
        tasks = self.tasks_of_call(session_id, result.tool_call_id)
        ids = [t.task_id for t in tasks]
        answers = {result.id} | {t.tool_result_id for t in tasks if t.tool_result_id is not None}
        if any(self.history.has_message(session_id, answer) for answer in answers):
            now = self.clock()
            return await self.journal.update_many(ids, lambda t: core.commit(t, now=now)) if ids else []
        if ids:
            await self.journal.update_many(
                ids, lambda t: core.prepare_interrupted(t, tool_result_id=result.id)
            )
        await self.history.append(session_id, [result])
        if not ids:
            return []
        now = self.clock()
        return await self.journal.update_many(ids, lambda t: core.commit(t, now=now))

    async def recover(self) -> list[TaskRecord]:
        """Finish step 3 for every prepared tool result that reached the history."""
        ids = [
            t.task_id
            for t in self.journal.tasks()
            if t.tool_result_id is not None
            and not t.committed
            and self.history.has_message(t.session_id, t.tool_result_id)
        ]
        if not ids:
            return []
        now = self.clock()
        return await self.journal.update_many(ids, lambda t: core.commit(t, now=now))

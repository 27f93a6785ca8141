"""``HostTurn``: a turn a host drives itself, with its own tool loop.

The host gets one from :meth:`ExecutionCoordinator.turn
<afterword.tasks.coordinator.ExecutionCoordinator.turn>`, which holds the session's step lock
for the whole block; what the steps saw is settled when the block ends. The object only
forwards to the collaborators it is given, so it never outlives the lock in a useful way.
"""

from __future__ import annotations

from collections.abc import Collection

from ..history import Message
from .compaction import Compaction
from .records import TaskRecord
from .toolcalls import ToolCallProcessor
from .turns import TurnOutcome, TurnRunner


class HostTurn:
    """The steps, tool results and compactions of one host-driven turn of ``session_id``."""

    def __init__(
        self, session_id: str, *, runner: TurnRunner, processor: ToolCallProcessor, compaction: Compaction
    ) -> None:
        self.session_id = session_id
        self.runner = runner
        self.processor = processor
        self.compaction = compaction
        self.steps: list[TurnOutcome] = []

    async def step(self, user_message: Message | None = None) -> TurnOutcome:
        """One model step (the first with the user's message, later ones after tool results).

        What the steps saw is consumed when the block ends after a successful last step."""
        outcome = await self.runner.step(self.session_id, user_message, consume=False)
        self.steps.append(outcome)
        return outcome

    async def commit_tool_result(
        self, result: Message, *, reported_terminal: Collection[str] = ()
    ) -> list[TaskRecord]:
        return await self.processor.commit_tool_result(
            self.session_id, result, reported_terminal=reported_terminal
        )

    async def compact(self, summary: str, *, handoff_id: str) -> Message:
        """Write a compaction handoff between steps of this turn (never inside a call/result
        pair: :class:`CompactionRefused` while a call waits for its result)."""
        return await self.compaction.handoff_locked(self.session_id, summary, handoff_id=handoff_id)

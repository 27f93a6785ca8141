"""``ToolAnswers``: answering the tool calls of a turn so that none stays open.

A tool call without a result blocks every later model step of its session, so each call a
turn makes gets exactly one committed result: the tool's own answer, or a stand-in saying
why there is none (the turn was interrupted, the round limit was reached, the answer could
not be stored). A stand-in names the background tasks the call started; each of them is
notified when it ends.
"""

from __future__ import annotations

import logging

import anyio

from ..history import InvalidMessageError, Message, MessageTooLarge, ToolCall
from . import core
from .toolcalls import ToolCallProcessor
from .toolloop import ToolExecutor, ToolResult, tool_result_message
from .turns import describe_error

_log = logging.getLogger(__name__)
INTERRUPTED_TOOL_RESULT = "The tool call was interrupted before it finished; its result is unknown."
UNRECORDABLE_TOOL_RESULT = "The tool's result could not be recorded ({error}); it is lost."
ROUND_LIMIT_TOOL_RESULT = (
    "The tool call was not run: this turn reached its limit of {limit} tool rounds. "
    "It can be made again in a later turn."
)


class ToolAnswers:
    """Runs tool calls and commits one result for each, through ``processor``."""

    def __init__(self, processor: ToolCallProcessor) -> None:
        self.processor = processor

    async def run(self, tools: ToolExecutor, session_id: str, calls: list[ToolCall]) -> list[Message]:
        """Run each call and commit its result; a cancelled loop still closes every call."""
        written: list[Message] = []
        try:
            for call in calls:
                try:
                    result = await tools(session_id, call)
                except Exception as exc:  # the tool failed: the model is told, the loop goes on
                    result = ToolResult(content=f"The tool failed: {describe_error(exc)}", is_error=True)
                message = tool_result_message(call, result)
                try:
                    await self.processor.commit_tool_result(
                        session_id, message, reported_terminal=self._reports(session_id, call, result)
                    )
                except (InvalidMessageError, MessageTooLarge) as exc:
                    # The tool's answer cannot be stored (too large, malformed): the model is
                    # told so instead, and the session goes on.
                    with anyio.CancelScope(shield=True):
                        message = await self.stand_in(
                            session_id, call, UNRECORDABLE_TOOL_RESULT.format(error=describe_error(exc))
                        )
                written.append(message)
        finally:
            answered = {m.tool_call_id for m in written}
            left = [c for c in calls if c.id not in answered]
            if left:
                # Interrupted or failed midway: an unanswered call would block the session.
                with anyio.CancelScope(shield=True):
                    for call in left:
                        await self.stand_in(session_id, call)
        return written

    def _reports(self, session_id: str, call: ToolCall, result: ToolResult) -> list[str]:
        """The tool's claims that its result reports a task's end, minus the false ones.

        A claim about a task that has not ended (or that this call did not start) is refused
        and the tool's answer kept: that task stays handed off and is notified when it ends.
        """
        tasks = {t.task_id: t for t in self.processor.tasks_of_call(session_id, call.id)}
        kept = [i for i in result.reported_terminal if i in tasks and core.is_terminal(tasks[i])]
        refused = sorted(set(result.reported_terminal) - set(kept))
        if refused:
            _log.warning(
                "session %r, tool %r: refused the report of %s as ended (not ended, or not started "
                "by this call); they will be notified when they end",
                session_id,
                call.name,
                refused,
            )
        return kept

    async def stand_in(self, session_id: str, call: ToolCall, text: str = INTERRUPTED_TOOL_RESULT) -> Message:
        """Close ``call`` with ``text`` as its error result; tasks it started are notified when they end."""
        started = [t.task_id for t in self.processor.tasks_of_call(session_id, call.id)]
        if started:
            text += (
                f" It started background task(s) {', '.join(started)}; how each ends is reported"
                " in a separate notification."
            )
        message = tool_result_message(call, ToolResult(content=text, is_error=True))
        await self.processor.commit_interrupted(session_id, message)
        return message

"""The host's side of the tool loop: what the coordinator calls, and what a turn returns.

A host implements :class:`ToolExecutor` (one async callable) and hands it to the
``ExecutionCoordinator``. Whenever a model step - a user's turn or an automatic one - opens
tool calls, the coordinator runs them through the executor, commits each result through the
``ToolCallProcessor`` (so tasks the call started are ``committed``) and runs the next model
step, until the model answers without a tool call. The whole loop holds the session's step
lock, so nothing else runs a model step of that session meanwhile.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from ..history import Message, MetaValue, ToolCall
from .turns import TurnOutcome

TOOL_RESULT_PREFIX = "tool-result:"


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool returned.

    Args:
        content: the tool result text the model reads.
        reported_terminal: ids of tasks this call started whose end ``content`` already
            reports (the tool waited and saw them finish); they get no separate notification.
        is_error: the tool failed; ``content`` says how.
    """

    content: str
    reported_terminal: tuple[str, ...] = ()
    is_error: bool = False


class ToolExecutor(Protocol):
    """Runs one tool call for a session. Start background commands with
    ``supervisor.start(session_id, call.id, ...)`` so the task belongs to this call."""

    async def __call__(self, session_id: str, call: ToolCall) -> ToolResult: ...


def tool_result_id(call_id: str) -> str:
    """The result message's id: one per call, so a retried commit is a no-op."""
    return TOOL_RESULT_PREFIX + call_id


def tool_result_message(call: ToolCall, result: ToolResult) -> Message:
    meta: dict[str, MetaValue] = {"tool_name": call.name}
    if result.is_error:
        meta["is_error"] = True
    return Message(
        id=tool_result_id(call.id), role="tool", content=result.content, tool_call_id=call.id, meta=meta
    )


class TurnResult(msgspec.Struct, frozen=True, kw_only=True):
    """One turn: its model steps in order and the tool results between them.

    ``open_calls`` lists tool calls the last step opened that nobody answered (the
    coordinator has no executor): the host must answer them before the next step. With an
    executor a turn closes every call it opened; one that reached the tool-round limit answers
    the calls it did not run as not run and says so in ``stopped``.
    """

    session_id: str
    steps: tuple[TurnOutcome, ...]
    tool_results: tuple[Message, ...] = ()
    open_calls: tuple[ToolCall, ...] = ()
    stopped: str | None = None  # "max_tool_rounds": the turn ended at the limit
    consumed: tuple[str, ...] = ()  # tasks the turn handled (its last step succeeded)

    @property
    def succeeded(self) -> bool:
        return bool(self.steps) and self.steps[-1].succeeded

    @property
    def error(self) -> str | None:
        return self.steps[-1].error if self.steps else None

    @property
    def replies(self) -> tuple[Message, ...]:
        return tuple(m for s in self.steps for m in s.replies)

    @property
    def delivered(self) -> tuple[str, ...]:
        return tuple(t for s in self.steps for t in s.delivered)

    @property
    def seen(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for s in self.steps for t in s.seen))

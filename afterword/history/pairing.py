"""Tool-call pairing: which tool calls an assistant opened that no tool message answered yet.

A conversation is at a safe boundary only when this set is empty: any other message placed
between a call and its result would break the call/result pairing providers require.
"""

from __future__ import annotations

from collections.abc import Iterable

from .message import Message


def open_tool_calls(messages: Iterable[Message]) -> set[str]:
    """Ids of tool calls opened by an assistant message and not yet answered by a tool message.

    Messages are read oldest first. A tool message answering an id that was never opened in
    ``messages`` (its call fell outside the window) changes nothing.
    """
    opened: set[str] = set()
    for message in messages:
        if message.role == "assistant":
            opened.update(message.call_ids())
        elif message.role == "tool" and message.tool_call_id is not None:
            opened.discard(message.tool_call_id)
    return opened


def pairing_closed(messages: Iterable[Message]) -> bool:
    """True when no tool call in ``messages`` is waiting for its result."""
    return not open_tool_calls(messages)

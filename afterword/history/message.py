"""The message record shared by every history consumer (task journal, continuation worker)."""

from __future__ import annotations

from typing import Literal

import msgspec

Role = Literal["user", "assistant", "system", "tool"]
MetaValue = str | int | bool | None


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call an assistant message opens: what to run, not only its id.

    ``arguments`` is the JSON text the model produced (providers hand it over as text, and
    keeping the text keeps it exact). A call stored by an older version, as a bare id, reads
    back with an empty ``name`` and ``arguments``.
    """

    id: str
    name: str = ""
    arguments: str = ""


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One conversation message.

    ``id`` is the idempotency key: appending a message whose id the conversation already holds
    is a no-op. An assistant message lists the tool calls it opens in ``tool_calls`` (as
    :class:`ToolCall`; a bare id string is still accepted and is how older records read); a
    ``tool`` message answers one of them through ``tool_call_id``. ``meta`` carries small
    host-side facts (``kind`` and the like) that are never model text.
    """

    id: str
    role: Role
    content: str
    meta: dict[str, MetaValue] = {}
    tool_call_id: str | None = None
    tool_calls: tuple[ToolCall | str, ...] = ()

    def calls(self) -> tuple[ToolCall, ...]:
        """The tool calls this message opens, bare ids read as calls without name/arguments."""
        return tuple(c if isinstance(c, ToolCall) else ToolCall(id=c) for c in self.tool_calls)

    def call_ids(self) -> tuple[str, ...]:
        return tuple(c.id if isinstance(c, ToolCall) else c for c in self.tool_calls)

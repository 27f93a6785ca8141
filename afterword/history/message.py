"""The message record shared by every history consumer (task journal, continuation worker)."""

from __future__ import annotations

from typing import Literal

import msgspec

Role = Literal["user", "assistant", "system", "tool"]
MetaValue = str | int | bool | None


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One conversation message.

    ``id`` is the idempotency key: appending a message whose id the conversation already holds
    is a no-op. An assistant message lists the tool calls it opens in ``tool_calls``; a
    ``tool`` message answers one of them through ``tool_call_id``. ``meta`` carries small
    host-side facts (``kind`` and the like) that are never model text.
    """

    id: str
    role: Role
    content: str
    meta: dict[str, MetaValue] = {}
    tool_call_id: str | None = None
    tool_calls: tuple[str, ...] = ()

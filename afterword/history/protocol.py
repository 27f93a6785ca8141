"""The conversation history contract every implementation keeps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .message import Message


class ConversationHistory(Protocol):
    """Durable, per-conversation message history."""

    async def append(self, conversation_id: str, messages: Sequence[Message]) -> None:
        """Append ``messages`` atomically (all or nothing).

        Idempotent by message id: a message whose id the conversation already holds is
        skipped, so re-appending after a crash never writes it twice.
        """
        ...

    async def latest(self, conversation_id: str, limit: int) -> list[Message]:
        """The newest ``limit`` messages of the conversation, oldest first."""
        ...

    def has_message(self, conversation_id: str, message_id: str) -> bool:
        """Whether the conversation currently holds a message with this id."""
        ...


class BoundaryHistory(ConversationHistory, Protocol):
    """A history that can append only at a safe boundary, as one ordered step."""

    async def append_at_boundary(
        self, conversation_id: str, messages: Sequence[Message], *, window: int = 256
    ) -> bool:
        """Append ``messages`` only if no tool call is open, counting appends that are reserved
        but not yet durable; returns False, writing nothing, if a call is open."""
        ...

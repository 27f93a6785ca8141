"""Durable conversation history: messages, tool-call pairing, a bounded WAL-backed store."""

from .durable import DurableHistory, StoredMessage, conversation_digest
from .errors import (
    HistoryCorruptError,
    HistoryError,
    InvalidMessageError,
    MessageIdConflict,
    MessageTooLarge,
    MessageTooLargeError,
    ToolCallIdReused,
)
from .message import Message, MetaValue, Role, ToolCall
from .pairing import open_tool_calls, pairing_closed
from .protocol import BoundaryHistory, ConversationHistory

__all__ = [
    "BoundaryHistory",
    "ConversationHistory",
    "DurableHistory",
    "HistoryCorruptError",
    "HistoryError",
    "InvalidMessageError",
    "Message",
    "MessageIdConflict",
    "MessageTooLarge",
    "MessageTooLargeError",
    "MetaValue",
    "Role",
    "StoredMessage",
    "ToolCall",
    "ToolCallIdReused",
    "conversation_digest",
    "open_tool_calls",
    "pairing_closed",
]

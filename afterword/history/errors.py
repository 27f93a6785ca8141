"""Errors of the conversation history. Each says whose fault it is.

* ``InvalidMessageError`` - the caller handed in a malformed message or batch; two kinds of
  it name a reused id: ``MessageIdConflict`` (an id the conversation holds, with another
  body) and ``ToolCallIdReused`` (a tool call id an earlier message of the conversation
  already opened).
* ``MessageTooLarge`` - a message or batch exceeds the store's bounds (the caller's fault); its
  older name ``MessageTooLargeError`` is the same class.
* ``HistoryCorruptError`` - a stored history record is unreadable or names another
  conversation than its key implies (the state on disk's fault; fail closed).
"""

from __future__ import annotations

from ..errors import AfterwordError, CallerError, StateError


class HistoryError(AfterwordError):
    """Base of every error raised by ``afterword.history``."""


class InvalidMessageError(HistoryError, CallerError, ValueError):
    """A message or batch breaks the history's rules."""


class MessageIdConflict(InvalidMessageError):
    """A message id the conversation already holds arrived with a different body.

    Re-appending the same message is a no-op (that is what makes a retry after a crash safe);
    a different message under a held id would otherwise vanish without a trace."""


class ToolCallIdReused(InvalidMessageError):
    """An assistant message opens a tool call id the conversation already opened: its result
    could not be told apart from the earlier call's."""


class MessageTooLarge(HistoryError, CallerError):
    """A message or batch does not fit the record store's per-record or per-commit bound."""


# Every "too large" error is named ``<what>TooLarge``; the old name stays importable.
MessageTooLargeError = MessageTooLarge


class HistoryCorruptError(HistoryError, StateError):
    """Stored history cannot be trusted: undecodable, or a key collision between conversations."""

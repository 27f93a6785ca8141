"""Errors of the conversation history. Each says whose fault it is.

* ``InvalidMessageError`` - the caller handed in a malformed message or batch.
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


class MessageTooLarge(HistoryError, CallerError):
    """A message or batch does not fit the record store's per-record or per-commit bound."""


# Every "too large" error is named ``<what>TooLarge``; the old name stays importable.
MessageTooLargeError = MessageTooLarge


class HistoryCorruptError(HistoryError, StateError):
    """Stored history cannot be trusted: undecodable, or a key collision between conversations."""

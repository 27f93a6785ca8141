"""Errors of the write-ahead log."""

from __future__ import annotations

from ..errors import AfterwordError, CallerError, StateError


class WalError(AfterwordError):
    """Base of every error raised by ``afterword.wal``."""


class WalCorruptError(WalError, StateError):
    """The log holds damage that a crash cannot explain (fail closed, never repaired)."""


class TransactionTooLarge(WalError, CallerError):
    """The caller's transaction exceeds a configured bound (the caller's fault)."""


class WalClosedError(WalError, CallerError):
    """The log was closed; no further commits are accepted."""

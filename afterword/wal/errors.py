"""Errors of the write-ahead log."""

from __future__ import annotations


class WalError(Exception):
    """Base of every error raised by ``afterword.wal``."""


class WalCorruptError(WalError):
    """The log holds damage that a crash cannot explain (fail closed, never repaired)."""


class TransactionTooLarge(WalError):
    """The caller's transaction exceeds a configured bound (the caller's fault)."""


class WalClosedError(WalError):
    """The log was closed; no further commits are accepted."""

"""Errors of the write-ahead log."""

from __future__ import annotations

from ..errors import AfterwordError, CallerError, StateError


class WalError(AfterwordError):
    """Base of every error raised by ``afterword.wal``."""


class WalCorruptError(WalError, StateError):
    """The log holds damage that a crash cannot explain (fail closed, never repaired)."""


class WalEvidenceError(WalCorruptError):
    """The log holds less than the MANIFEST says was acknowledged (fail closed).

    ``rule`` is one of ``segment_missing``, ``segment_short``, ``segment_replaced``,
    ``acknowledged_lost``.
    """

    def __init__(self, path: str, rule: str, detail: str = "") -> None:
        self.path = path
        self.rule = rule
        self.detail = detail
        super().__init__(f"{path}: {rule}" + (f" ({detail})" if detail else ""))


class TransactionTooLarge(WalError, CallerError):
    """The caller's transaction exceeds a configured bound (the caller's fault)."""


class WalClosedError(WalError, CallerError):
    """The log was closed; no further commits are accepted."""

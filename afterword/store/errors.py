"""Errors of the record store. Each says whose fault it is."""

from __future__ import annotations

from ..errors import AfterwordError, CallerError, StateError


class StoreError(AfterwordError):
    """Base of every error raised by ``afterword.store``."""


class StoreLockedError(StoreError, StateError):
    """Another owner (process or open store in this process) holds the state directory."""


class OwnershipLostError(StoreError, StateError):
    """This process can no longer prove it owns its state directory (the directory or its
    lock file was removed or replaced while open): writes are refused; stop and restart."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"{path}: ownership lost ({detail}); writes refused, the process must stop")


class StoreCorruptError(StoreError, StateError):
    """Committed state on disk is damaged or not ours (fail closed; nothing was changed)."""


class StoreClosedError(StoreError, CallerError):
    """The store was closed."""


class RecordTooLarge(StoreError, CallerError):
    """A record value exceeds the per-record limit (the caller's fault)."""


class InvalidKeyError(StoreError, CallerError):
    """A record key is empty, too long or uses characters outside the allowed set."""


class VersionConflict(StoreError, CallerError):
    """An optimistic expectation failed: the record changed since the caller read it."""

    def __init__(self, key: str, expected: int | None, actual: int | None) -> None:
        self.key = key
        self.expected = expected
        self.actual = actual
        super().__init__(f"record {key!r}: expected version {expected}, found {actual}")

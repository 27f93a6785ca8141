"""Errors of the disk layer. Each says whose fault it is.

* ``UnsafeStateError`` - the state on disk breaks an owner-only/fail-closed rule (the outside
  world's fault: someone changed modes, linked, swapped or grew a file).
* ``DurabilityError`` - the operating system failed to make bytes durable. Fatal: the data's
  fate is unknown, so the layer refuses every later write until it is reopened and replayed.
* ``DiskFailedError`` - a write was refused because an earlier failure (a ``DurabilityError``,
  or any error a writer hit midway and reported with ``StateRoot.fail``) poisoned the root.
"""

from __future__ import annotations

import errno

from ..errors import AfterwordError, StateError

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskError(AfterwordError):
    """Base of every error raised by ``afterword.disk``."""


class UnsafeStateError(DiskError, StateError):
    """A path under the state root violates a fail-closed rule.

    ``rule`` is one of: ``symlink``, ``not_regular``, ``not_directory``, ``hard_link``,
    ``wrong_owner``, ``permissive_mode``, ``identity_changed``, ``size_changed``, ``too_large``,
    ``missing``, ``bad_lock_file``.
    """

    def __init__(self, path: str, rule: str, detail: str = "") -> None:
        self.path = path
        self.rule = rule
        self.detail = detail
        text = f"{path}: {rule}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)


class DurabilityError(DiskError, StateError):
    """fsync/fdatasync (or a write it would cover) failed; never retried."""

    def __init__(self, path: str, operation: str, errno_: int | None) -> None:
        self.path = path
        self.operation = operation
        self.errno = errno_
        super().__init__(f"{path}: {operation} failed (errno {errno_}); state must be reopened")


class StorageFullError(DiskError, StateError):
    """The file system has no space (ENOSPC/EDQUOT) for a new file; nothing was changed.

    Raised only where the failed work was discarded whole (a temporary file), so the state
    directory stays writable and a retry can succeed once space is freed.
    """

    def __init__(self, path: str, errno_: int | None) -> None:
        self.path = path
        self.errno = errno_
        super().__init__(f"{path}: no space left to create it (errno {errno_}); free space and retry")


def storage_errno(exc: BaseException) -> bool:
    """True when ``exc`` is (or records) an out-of-space failure."""
    return getattr(exc, "errno", None) in _FULL_ERRNOS


class DiskFailedError(DiskError, StateError):
    """Refused: an earlier failure made this state directory read-only until reopened."""

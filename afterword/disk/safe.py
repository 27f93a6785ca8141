"""Fail-closed writes to an owner-only state directory: atomic replaces, whole-file creation,
fsyncs that poison the root when they fail (never retried), and removals.

Reading and the rules every file must pass live in :mod:`afterword.disk.root` and
:mod:`afterword.disk.rules`; this module's names stay importable from here.
"""

from __future__ import annotations

import itertools
import os

from .errors import DurabilityError, StorageFullError, storage_errno
from .root import CheckedRoot
from .rules import (
    DIR_MODE,
    FILE_MODE,
    TEMP_MARK,
    FileHandle,
    check_dir_stat,
    check_file_stat,
    is_temp_name,
)

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "TEMP_MARK",
    "FileHandle",
    "StateRoot",
    "check_dir_stat",
    "check_file_stat",
    "is_temp_name",
]

_temp_counter = itertools.count()


class StateRoot(CheckedRoot):
    """An owner-only directory tree whose every access is checked (see :mod:`.root` for
    the rules), with the writes that keep it durable.

    Args:
        root: the state directory; created (mode 0700, parent fsynced) when ``create``.
        disk: the seam; :class:`~afterword.disk.OsDisk` by default.
    """

    # -- directories -------------------------------------------------------------------------
    def ensure_dir(self, rel: str) -> bool:
        """Create ``rel`` (0700, parent fsynced) if absent; validate it. True if created."""
        created = False
        parts = rel.split("/")
        for i in range(len(parts)):
            sub = "/".join(parts[: i + 1])
            full = self.path(sub)
            if not self.exists(sub):
                self.check_writable()
                self.disk.mkdir(full, DIR_MODE)
                parent = os.path.dirname(full)
                self._durable(parent, "fsync_dir", self.disk.fsync_dir, parent)
                created = True
        self.check_dir(rel)
        return created

    def sync_dir(self, rel: str) -> None:
        full = self.path(rel)
        self._durable(full, "fsync_dir", self.disk.fsync_dir, full)

    def pwrite(self, handle: FileHandle, data: bytes, offset: int) -> None:
        self.check_writable()
        try:
            self.disk.pwrite(handle.fd, data, offset)
        except OSError as exc:
            # A failed write leaves the page cache in an unknown state: as fatal as fsync.
            err = DurabilityError(handle.path, "write", exc.errno)
            self._failed = err
            raise err from None

    def fsync(self, handle: FileHandle) -> None:
        self._durable(handle.path, "fsync", self.disk.fsync, handle.fd)

    def fdatasync(self, handle: FileHandle) -> None:
        self._durable(handle.path, "fdatasync", self.disk.fdatasync, handle.fd)

    def truncate(self, handle: FileHandle, length: int) -> None:
        self.check_writable()
        self.disk.ftruncate(handle.fd, length)

    def fallocate(self, handle: FileHandle, length: int) -> None:
        self.check_writable()
        self.disk.fallocate(handle.fd, 0, length)

    def write_atomic(self, rel: str, data: bytes, *, sync_dir: bool = True) -> None:
        """Replace ``rel`` atomically: temp in the same dir, write, fsync, rename, fsync dir.

        With ``sync_dir=False`` the caller batches the directory fsync via :meth:`sync_dir`.
        """
        self.check_writable()
        head, name = self._split(rel)
        temp_rel = (head + "/" if head else "") + f".{name}{TEMP_MARK}{os.getpid()}-{next(_temp_counter)}"
        handle = self.open_file(temp_rel, writable=True, create=True)
        try:
            try:
                self.disk.pwrite(handle.fd, data, 0)
            except OSError as exc:
                # Only the temporary saw the failed write: it is discarded and nothing durable
                # changed, so a full disk leaves the root writable for a retry.
                if storage_errno(exc):
                    raise self._full(rel, exc) from None
                err = DurabilityError(handle.path, "write", exc.errno)
                self._failed = err
                raise err from None
            self.fsync(handle)
            self.check_identity(handle)
        except BaseException:
            self.close(handle)
            self._discard(handle.path)
            raise
        self.close(handle)
        try:
            self.disk.rename(handle.path, self.path(rel))
        except OSError:
            self._discard(handle.path)
            raise
        if sync_dir:
            self.sync_dir(head)
        self.full = None

    def create_whole(self, rel: str, size: int, *, zero_fill: bool) -> FileHandle:
        """Create ``rel`` at ``size`` bytes whole or not at all, and return it open for writing.

        The file is made under a temporary name (zeros written, or ``ftruncate`` when not
        ``zero_fill``), fsynced, renamed into place and the directory fsynced. Running out of
        space before the rename raises :class:`StorageFullError` and leaves nothing behind,
        without poisoning the root: nothing durable changed, so a later retry is safe.
        """
        self.check_writable()
        head, name = self._split(rel)
        temp_rel = (head + "/" if head else "") + f".{name}{TEMP_MARK}{os.getpid()}-{next(_temp_counter)}"
        temp_path = self.path(temp_rel)
        try:
            handle = self.open_file(temp_rel, writable=True, create=True)
        except OSError as exc:
            if storage_errno(exc):
                raise self._full(rel, exc) from None
            raise
        try:
            operation = "write"
            try:
                if zero_fill:
                    chunk = b"\x00" * min(size, 1 << 20)
                    for off in range(0, size, len(chunk)):
                        self.disk.pwrite(handle.fd, chunk[: min(len(chunk), size - off)], off)
                else:
                    self.disk.ftruncate(handle.fd, size)
                operation = "fsync"
                self.disk.fsync(handle.fd)
            except OSError as exc:
                if storage_errno(exc):
                    raise self._full(rel, exc) from None
                # Anything else is the disk failing: as fatal as any failed fsync.
                err = DurabilityError(self.path(rel), operation, exc.errno)
                self._failed = err
                raise err from None
            self.check_identity(handle)
            self.disk.rename(temp_path, self.path(rel))
        except BaseException:
            self.close(handle)
            self._discard(temp_path)
            raise
        handle.path = self.path(rel)
        self.sync_dir(head)
        self.full = None
        return handle

    def _full(self, rel: str, exc: OSError) -> StorageFullError:
        err = StorageFullError(self.path(rel), exc.errno)
        self.full = err
        self.storage_full_total += 1
        return err

    def _discard(self, path: str) -> None:
        try:
            self.disk.unlink(path)
        except OSError:
            pass

    def remove(self, rel: str, *, sync_dir: bool = True) -> bool:
        """Unlink ``rel`` if present; True if it existed."""
        self.check_writable()
        head, _ = self._split(rel)
        try:
            self.disk.unlink(self.path(rel))
        except FileNotFoundError:
            return False
        if sync_dir:
            self.sync_dir(head)
        return True

    def remove_temporaries(self, rel_dir: str) -> list[str]:
        """Delete cleanup-only temporaries left by interrupted atomic writes."""
        removed = [n for n in self.listdir(rel_dir) if is_temp_name(n)]
        for name in removed:
            self.remove(f"{rel_dir}/{name}" if rel_dir else name, sync_dir=False)
        if removed:
            self.sync_dir(rel_dir)
        return removed

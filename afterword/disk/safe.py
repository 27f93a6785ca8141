"""Fail-closed writes to an owner-only state directory: atomic replaces, whole-file creation,
fsyncs that poison the root when they fail (never retried), and removals.

Reading and the rules every file must pass live in :mod:`afterword.disk.root` (a
:class:`StateRoot` holds a :class:`~afterword.disk.root.CheckedRoot` and forwards its reads
to it) and :mod:`afterword.disk.rules`; this module's names stay importable from here.
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
from .seam import Disk

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


class StateRoot:
    """An owner-only directory tree whose every access is checked (see :mod:`.root` for
    the rules), with the writes that keep it durable. Reads, checks and the poison flag are
    its :class:`CheckedRoot`'s (``checked``); every write here takes the poison path: a failed
    write, flush, truncate or allocation poisons the root, and nothing is retried.

    Args:
        root: the state directory; created (mode 0700, parent fsynced) when ``create``.
        disk: the seam; :class:`~afterword.disk.OsDisk` by default.
    """

    def __init__(self, root: str, disk: Disk | None = None, *, create: bool = True) -> None:
        self.checked = CheckedRoot(root, disk, create=create)
        self.root = self.checked.root
        self.disk = self.checked.disk
        self.euid = self.checked.euid

    # -- reads and checks: the checked root's ---------------------------------------------------
    def path(self, rel: str) -> str:
        return self.checked.path(rel)

    def split(self, rel: str) -> tuple[str, str]:
        return self.checked.split(rel)

    def check_dir(self, rel: str) -> None:
        self.checked.check_dir(rel)

    def exists(self, rel: str) -> bool:
        return self.checked.exists(rel)

    def listdir(self, rel: str) -> list[str]:
        return self.checked.listdir(rel)

    def open_file(self, rel: str, *, writable: bool = False, create: bool = False) -> FileHandle:
        return self.checked.open_file(rel, writable=writable, create=create)

    def close(self, handle: FileHandle) -> None:
        self.checked.close(handle)

    def check_identity(self, handle: FileHandle, *, size: int | None = None) -> None:
        self.checked.check_identity(handle, size=size)

    def read_file(self, rel: str, *, max_size: int) -> bytes:
        return self.checked.read_file(rel, max_size=max_size)

    def read_all(self, rel_dir: str, names: list[str], *, max_size: int) -> list[tuple[str, bytes]]:
        return self.checked.read_all(rel_dir, names, max_size=max_size)

    def pread(self, handle: FileHandle, size: int, offset: int) -> bytes:
        return self.checked.pread(handle, size, offset)

    def lock_root(self) -> FileHandle:
        """The root directory, open and ``flock``ed exclusively (see ``CheckedRoot``)."""
        return self.checked.lock_root()

    def check_root_identity(self, handle: FileHandle) -> None:
        self.checked.check_root_identity(handle)

    def leave_gone_marker(self, text: bytes) -> bool:
        return self.checked.leave_gone_marker(text)

    # -- the poison flag and the space notes (the checked root's) ------------------------------
    @property
    def failed(self) -> Exception | None:
        return self.checked.failed

    @property
    def full(self) -> StorageFullError | None:
        """The last write refused for lack of space, until a write succeeds."""
        return self.checked.full

    @full.setter
    def full(self, err: StorageFullError | None) -> None:
        self.checked.full = err

    @property
    def storage_full_total(self) -> int:
        return self.checked.storage_full_total

    def fail(self, exc: Exception) -> None:
        """Poison the root (see ``CheckedRoot.fail``)."""
        self.checked.fail(exc)

    def check_writable(self) -> None:
        self.checked.check_writable()

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
                self.checked.durable(parent, "fsync_dir", self.disk.fsync_dir, parent)
                created = True
        self.check_dir(rel)
        return created

    def sync_dir(self, rel: str) -> None:
        full = self.path(rel)
        self.checked.durable(full, "fsync_dir", self.disk.fsync_dir, full)

    def pwrite(self, handle: FileHandle, data: bytes, offset: int) -> None:
        self.checked.check_writable()
        try:
            self.disk.pwrite(handle.fd, data, offset)
        except OSError as exc:
            # A failed write leaves the page cache in an unknown state: as fatal as fsync.
            err = DurabilityError(handle.path, "write", exc.errno)
            self.fail(err)
            raise err from None

    def fsync(self, handle: FileHandle) -> None:
        self.checked.durable(handle.path, "fsync", self.disk.fsync, handle.fd)

    def fdatasync(self, handle: FileHandle) -> None:
        self.checked.durable(handle.path, "fdatasync", self.disk.fdatasync, handle.fd)

    def truncate(self, handle: FileHandle, length: int) -> None:
        """Cut or extend ``handle``'s file to ``length``; a failure poisons the root like any
        write (the file's size is then unknown)."""
        self.checked.durable(handle.path, "truncate", self.disk.ftruncate, handle.fd, length)

    def fallocate(self, handle: FileHandle, length: int) -> None:
        """Allocate ``length`` bytes of ``handle``'s file; a failure poisons the root like any
        write (part of the range may be allocated)."""
        self.checked.durable(handle.path, "fallocate", self.disk.fallocate, handle.fd, 0, length)

    def write_atomic(self, rel: str, data: bytes, *, sync_dir: bool = True) -> None:
        """Replace ``rel`` atomically: temp in the same dir, write, fsync, rename, fsync dir.

        With ``sync_dir=False`` the caller batches the directory fsync via :meth:`sync_dir`.
        """
        self.check_writable()
        head, name = self.split(rel)
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
                self.fail(err)
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
        head, name = self.split(rel)
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
                self.fail(err)
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
        self.checked.full = err
        self.checked.storage_full_total += 1
        return err

    def _discard(self, path: str) -> None:
        try:
            self.disk.unlink(path)
        except OSError:
            pass

    def remove(self, rel: str, *, sync_dir: bool = True) -> bool:
        """Unlink ``rel`` if present; True if it existed."""
        self.check_writable()
        head, _ = self.split(rel)
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

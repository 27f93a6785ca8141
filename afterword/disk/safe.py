"""Fail-closed access to an owner-only state directory, built on the ``Disk`` seam.

Rules (each violation raises :class:`UnsafeStateError` naming the path and the rule):

1. No symlink in any component under the state root: directories are walked one component
   at a time with ``dir_fd`` and ``O_NOFOLLOW``.
2. Directories are mode 0700 and files 0600 when created; existing ones may carry no group or
   other permission bits, and must be owned by the effective uid.
3. Files are regular and have exactly one link.
4. A file's identity (``st_dev``, ``st_ino``) is re-checked against its path before each
   commit, so a replaced file is never written through an old descriptor.
5. A failed fsync/fdatasync or write poisons the root, as does any failure a writer reports
   through :meth:`StateRoot.fail`: every later mutation raises :class:`DiskFailedError` until
   the state is reopened and recovered (never retry an fsync).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from dataclasses import dataclass, field

from .errors import DiskFailedError, DurabilityError, StorageFullError, UnsafeStateError, storage_errno
from .seam import Disk, OsDisk

DIR_MODE = 0o700
FILE_MODE = 0o600
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_temp_counter = itertools.count()

TEMP_MARK = ".tmp-"


def is_temp_name(name: str) -> bool:
    """Temporaries of an interrupted atomic write: cleanup-only, never committed evidence."""
    return name.startswith(".") and TEMP_MARK in name


@dataclass
class FileHandle:
    """An open, validated file. ``dev``/``ino`` are what the path pointed to at open."""

    fd: int
    path: str
    dev: int
    ino: int
    closed: bool = field(default=False)


def _check_owner_mode(path: str, st: os.stat_result, euid: int) -> None:
    if st.st_uid != euid:
        raise UnsafeStateError(path, "wrong_owner", f"owner uid {st.st_uid}, expected {euid}")
    if st.st_mode & 0o077:
        raise UnsafeStateError(path, "permissive_mode", f"mode {stat.S_IMODE(st.st_mode):04o}")


def check_file_stat(path: str, st: os.stat_result, euid: int) -> None:
    """The per-file rules: regular, one link, owner, no group/other bits."""
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeStateError(path, "not_regular")
    if st.st_nlink != 1:
        raise UnsafeStateError(path, "hard_link", f"{st.st_nlink} links")
    _check_owner_mode(path, st, euid)


def check_dir_stat(path: str, st: os.stat_result, euid: int) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateError(path, "not_directory")
    _check_owner_mode(path, st, euid)


class StateRoot:
    """An owner-only directory tree whose every access is checked.

    Args:
        root: the state directory; created (mode 0700, parent fsynced) when ``create``.
        disk: the seam; :class:`OsDisk` by default.
    """

    def __init__(self, root: str, disk: Disk | None = None, *, create: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.disk: Disk = disk if disk is not None else OsDisk()
        self.euid = os.geteuid()
        self._failed: Exception | None = None
        # The last write refused for lack of space, until a write succeeds (not a poison:
        # a refused write changed nothing durable).
        self.full: StorageFullError | None = None
        self.storage_full_total = 0
        if create:
            self._make_root()
        self._check_root()

    # -- poisoning ---------------------------------------------------------------------------
    @property
    def failed(self) -> Exception | None:
        return self._failed

    def fail(self, exc: Exception) -> None:
        """Poison the root: a writer hit ``exc`` midway and its in-memory view of the files
        can no longer be trusted, so every later mutation is refused until a reopen."""
        if self._failed is None:
            self._failed = exc

    def check_writable(self) -> None:
        if self._failed is not None:
            raise DiskFailedError(
                f"{self.root}: refusing writes after an earlier failure ({self._failed}); "
                "reopen to recover"
            ) from None

    def _durable(self, path: str, operation: str, fn: object, *args: object) -> None:
        self.check_writable()
        try:
            fn(*args)  # type: ignore[operator]
        except OSError as exc:
            err = DurabilityError(path, operation, exc.errno)
            self._failed = err
            raise err from None

    # -- paths -------------------------------------------------------------------------------
    def path(self, rel: str) -> str:
        if rel in ("", "."):
            return self.root
        parts = rel.split("/")
        for part in parts:
            if part in ("", ".", "..") or "\x00" in part:
                raise ValueError(f"invalid relative state path {rel!r}")
        return os.path.join(self.root, *parts)

    def _make_root(self) -> None:
        try:
            self.disk.lstat(self.root)
        except FileNotFoundError:
            parent = os.path.dirname(self.root)
            os.makedirs(parent, mode=DIR_MODE, exist_ok=True)
            self.disk.mkdir(self.root, DIR_MODE)
            self._durable(parent, "fsync_dir", self.disk.fsync_dir, parent)

    def _check_root(self) -> None:
        try:
            st = self.disk.lstat(self.root)
        except FileNotFoundError:
            raise UnsafeStateError(self.root, "missing") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeStateError(self.root, "symlink")
        check_dir_stat(self.root, st, self.euid)

    def _open_dir_fd(self, rel: str) -> int:
        """Walk ``rel`` from the root, one component at a time, never following a link."""
        try:
            fd = self.disk.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise self._open_error(self.root, exc, directory=True) from None
        try:
            st = self.disk.fstat(fd)
            check_dir_stat(self.root, st, self.euid)
            if rel in ("", "."):
                return fd
            walked = self.root
            for part in rel.split("/"):
                walked = os.path.join(walked, part)
                try:
                    nfd = self.disk.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise self._open_error(walked, exc, directory=True) from None
                self.disk.close(fd)
                fd = nfd
                check_dir_stat(walked, self.disk.fstat(fd), self.euid)
            return fd
        except BaseException:
            self.disk.close(fd)
            raise

    def _open_error(self, path: str, exc: OSError, *, directory: bool) -> Exception:
        if exc.errno == errno.ELOOP:
            return UnsafeStateError(path, "symlink")
        if exc.errno == errno.ENOTDIR:
            # Linux answers O_DIRECTORY|O_NOFOLLOW on a symlink with ENOTDIR, not ELOOP, so
            # ask what the entry is (the open already failed; this only names the rule).
            try:
                is_link = stat.S_ISLNK(self.disk.lstat(path).st_mode)
            except OSError:
                is_link = False
            if is_link or not directory:
                return UnsafeStateError(path, "symlink")
            return UnsafeStateError(path, "not_directory")
        if exc.errno == errno.ENOENT:
            return UnsafeStateError(path, "missing")
        return exc

    # -- directories -------------------------------------------------------------------------
    def check_dir(self, rel: str) -> None:
        """Validate every component of ``rel`` (raises ``UnsafeStateError``)."""
        self.disk.close(self._open_dir_fd(rel))

    def exists(self, rel: str) -> bool:
        try:
            self.disk.lstat(self.path(rel))
        except FileNotFoundError:
            return False
        return True

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

    def listdir(self, rel: str) -> list[str]:
        self.check_dir(rel)
        return sorted(self.disk.listdir(self.path(rel)))

    def sync_dir(self, rel: str) -> None:
        full = self.path(rel)
        self._durable(full, "fsync_dir", self.disk.fsync_dir, full)

    # -- files -------------------------------------------------------------------------------
    def _split(self, rel: str) -> tuple[str, str]:
        head, _, name = rel.rpartition("/")
        self.path(rel)  # validates components
        return head, name

    def open_file(self, rel: str, *, writable: bool = False, create: bool = False) -> FileHandle:
        """Open a file fail-closed; ``create`` makes it 0600 with ``O_EXCL``."""
        head, name = self._split(rel)
        full = self.path(rel)
        dfd = self._open_dir_fd(head)
        try:
            flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK
            if create:
                self.check_writable()
                flags |= os.O_CREAT | os.O_EXCL
            try:
                fd = self.disk.open(name, flags, 0o600, dir_fd=dfd)
            except OSError as exc:
                raise self._open_error(full, exc, directory=False) from None
        finally:
            self.disk.close(dfd)
        try:
            st = self.disk.fstat(fd)
            check_file_stat(full, st, self.euid)
        except BaseException:
            self.disk.close(fd)
            raise
        return FileHandle(fd=fd, path=full, dev=st.st_dev, ino=st.st_ino)

    def close(self, handle: FileHandle) -> None:
        if not handle.closed:
            handle.closed = True
            self.disk.close(handle.fd)

    def check_identity(self, handle: FileHandle) -> None:
        """The path must still name the inode we opened (and still obey the file rules)."""
        try:
            st = self.disk.lstat(handle.path)
        except FileNotFoundError:
            raise UnsafeStateError(handle.path, "identity_changed", "path removed") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeStateError(handle.path, "symlink")
        if (st.st_dev, st.st_ino) != (handle.dev, handle.ino):
            raise UnsafeStateError(handle.path, "identity_changed", "path names another inode")
        check_file_stat(handle.path, st, self.euid)

    def read_file(self, rel: str, *, max_size: int) -> bytes:
        """Read a whole file after checking its size against ``max_size`` (fail closed)."""
        handle = self.open_file(rel)
        try:
            size = self.disk.fstat(handle.fd).st_size
            if size > max_size:
                raise UnsafeStateError(handle.path, "too_large", f"{size} > {max_size} bytes")
            data = self.disk.pread(handle.fd, size, 0)
            self.check_identity(handle)
            return data
        finally:
            self.close(handle)

    def read_all(self, rel_dir: str, names: list[str], *, max_size: int) -> list[tuple[str, bytes]]:
        """Read many files of one directory through a single validated directory descriptor.

        Each file passes the same fail-closed rules as :meth:`read_file`.
        """
        dfd = self._open_dir_fd(rel_dir)
        out: list[tuple[str, bytes]] = []
        try:
            base = self.path(rel_dir)
            for name in names:
                full = os.path.join(base, name)
                try:
                    fd = self.disk.open(name, _READ_FLAGS, dir_fd=dfd)
                except OSError as exc:
                    raise self._open_error(full, exc, directory=False) from None
                try:
                    st = self.disk.fstat(fd)
                    check_file_stat(full, st, self.euid)
                    if st.st_size > max_size:
                        raise UnsafeStateError(full, "too_large", f"{st.st_size} > {max_size} bytes")
                    out.append((name, self.disk.pread(fd, st.st_size, 0)))
                finally:
                    self.disk.close(fd)
        finally:
            self.disk.close(dfd)
        return out

    def pwrite(self, handle: FileHandle, data: bytes, offset: int) -> None:
        self.check_writable()
        try:
            self.disk.pwrite(handle.fd, data, offset)
        except OSError as exc:
            # A failed write leaves the page cache in an unknown state: as fatal as fsync.
            err = DurabilityError(handle.path, "write", exc.errno)
            self._failed = err
            raise err from None

    def pread(self, handle: FileHandle, size: int, offset: int) -> bytes:
        return self.disk.pread(handle.fd, size, offset)

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

"""Fail-closed access to an owner-only state directory, built on the ``Disk`` seam: reading.

The writing half is :class:`afterword.disk.safe.StateRoot`; both apply these rules.

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

import fcntl
import os
import stat
from collections.abc import Callable

from .errors import DiskFailedError, DurabilityError, StorageFullError, UnsafeStateError
from .rules import (
    DIR_FLAGS,
    DIR_MODE,
    READ_FLAGS,
    FileHandle,
    check_dir_stat,
    check_file_stat,
    open_error,
)
from .seam import Disk, OsDisk


class CheckedRoot:
    """An owner-only directory tree whose every access is checked: paths, directory walks,
    validated opens and reads, identity checks, and the poison flag writers set. A
    :class:`~afterword.disk.StateRoot` holds one and adds the writes.

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
                f"{self.root}: refusing writes after an earlier failure ({self._failed}); reopen to recover"
            ) from None

    def durable(self, path: str, operation: str, fn: Callable[..., object], *args: object) -> None:
        """Run one mutating seam call; a failure poisons the root (never retried)."""
        self.check_writable()
        try:
            fn(*args)
        except OSError as exc:
            err = DurabilityError(path, operation, exc.errno)
            self.fail(err)
            raise err from None

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
            self._make_parents(parent)
            self.disk.mkdir(self.root, DIR_MODE)
            self.durable(parent, "fsync_dir", self.disk.fsync_dir, parent)
        except NotADirectoryError:
            pass  # a file in the path above: _check_root names it

    def _make_parents(self, path: str) -> None:
        """``os.makedirs(path, exist_ok=True)`` through the seam (mode 0700)."""
        missing: list[str] = []
        while True:
            try:
                self.disk.lstat(path)
                break
            except FileNotFoundError:
                missing.append(path)
                path = os.path.dirname(path)
        for directory in reversed(missing):
            try:
                self.disk.mkdir(directory, DIR_MODE)
            except FileExistsError:
                pass  # made meanwhile by someone else: as good

    def _check_root(self) -> None:
        try:
            st = self.disk.lstat(self.root)
        except FileNotFoundError:
            raise UnsafeStateError(self.root, "missing") from None
        except NotADirectoryError:
            raise UnsafeStateError(
                self.root, "not_directory", "a component of the path above it is a regular file"
            ) from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeStateError(self.root, "symlink")
        if stat.S_ISREG(st.st_mode):
            raise UnsafeStateError(
                self.root,
                "not_directory",
                "a file stands where the state directory belongs: a host leaves one when its "
                "directory is moved away while it runs; read it",
            )
        check_dir_stat(self.root, st, self.euid)

    def _open_dir_fd(self, rel: str) -> int:
        """Walk ``rel`` from the root, one component at a time, never following a link."""
        try:
            fd = self.disk.open(self.root, DIR_FLAGS)
        except OSError as exc:
            raise open_error(self.disk, self.root, exc, directory=True) from None
        try:
            st = self.disk.fstat(fd)
            check_dir_stat(self.root, st, self.euid)
            if rel in ("", "."):
                return fd
            walked = self.root
            for part in rel.split("/"):
                walked = os.path.join(walked, part)
                try:
                    nfd = self.disk.open(part, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise open_error(self.disk, walked, exc, directory=True) from None
                self.disk.close(fd)
                fd = nfd
                check_dir_stat(walked, self.disk.fstat(fd), self.euid)
            return fd
        except BaseException:
            self.disk.close(fd)
            raise

    def lock_root(self) -> FileHandle:
        """Open the root directory and take an exclusive, non-blocking ``flock`` on it.

        The lock belongs to the directory itself, not to a name inside it, so no file being
        removed or replaced can release it. Raises ``BlockingIOError`` while another open
        (another process, or another open in this one) holds it. Closing the handle releases it.
        """
        fd = self._open_dir_fd("")
        try:
            self.disk.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st = self.disk.fstat(fd)
        except BaseException:
            self.disk.close(fd)
            raise
        return FileHandle(fd=fd, path=self.root, dev=st.st_dev, ino=st.st_ino)

    def check_root_identity(self, handle: FileHandle) -> None:
        """The root path must still name the directory ``handle`` was opened on (a state
        directory moved away or replaced is no longer the one its lock protects)."""
        try:
            st = self.disk.lstat(self.root)
        except FileNotFoundError:
            raise UnsafeStateError(
                self.root, "identity_changed", "state directory moved away or removed"
            ) from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeStateError(self.root, "symlink")
        if (st.st_dev, st.st_ino) != (handle.dev, handle.ino):
            raise UnsafeStateError(self.root, "identity_changed", "path names another directory")

    def leave_gone_marker(self, text: bytes) -> bool:
        """Put a small regular file (``text``, 0600, fsynced with its parent) where the root
        directory was, if nothing is there now; True if made. A host whose state directory
        was moved away calls this, so that the next start does not create a new, empty
        directory in its place (an open refuses a root that is not a directory)."""
        try:
            fd = self.disk.open(self.root, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:
            return False  # something is at the path again, or its parent is gone too
        try:
            try:
                self.disk.pwrite(fd, text, 0)
                self.disk.fsync(fd)
            finally:
                self.disk.close(fd)
            self.disk.fsync_dir(os.path.dirname(self.root))
        except OSError:
            return False
        return True

    def check_dir(self, rel: str) -> None:
        """Validate every component of ``rel`` (raises ``UnsafeStateError``)."""
        self.disk.close(self._open_dir_fd(rel))

    def exists(self, rel: str) -> bool:
        try:
            self.disk.lstat(self.path(rel))
        except FileNotFoundError:
            return False
        return True

    def listdir(self, rel: str) -> list[str]:
        self.check_dir(rel)
        return sorted(self.disk.listdir(self.path(rel)))

    def split(self, rel: str) -> tuple[str, str]:
        """``rel`` as (its directory, its name), every component validated."""
        head, _, name = rel.rpartition("/")
        self.path(rel)  # validates components
        return head, name

    def open_file(self, rel: str, *, writable: bool = False, create: bool = False) -> FileHandle:
        """Open a file fail-closed; ``create`` makes it 0600 with ``O_EXCL``."""
        head, name = self.split(rel)
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
                raise open_error(self.disk, full, exc, directory=False) from None
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

    def check_identity(self, handle: FileHandle, *, size: int | None = None) -> None:
        """The path must still name the inode we opened (and still obey the file rules);
        with ``size``, the file must still be that long (a fixed-size file cut or grown under
        us: rule ``size_changed``)."""
        try:
            st = self.disk.lstat(handle.path)
        except FileNotFoundError:
            raise UnsafeStateError(handle.path, "identity_changed", "path removed") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeStateError(handle.path, "symlink")
        if (st.st_dev, st.st_ino) != (handle.dev, handle.ino):
            raise UnsafeStateError(handle.path, "identity_changed", "path names another inode")
        check_file_stat(handle.path, st, self.euid)
        if size is not None and st.st_size != size:
            raise UnsafeStateError(handle.path, "size_changed", f"{st.st_size} bytes, it had {size}")

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
        # Per file at an open of thousands: the path is built only to name a broken rule, and
        # the rules are first checked in one expression (a regular file, no group or other
        # bits, one link, ours), check_file_stat naming the one that failed.
        disk, euid, regular_private = self.disk, self.euid, stat.S_IFREG
        try:
            base = self.path(rel_dir)
            for name in names:
                try:
                    fd = disk.open(name, READ_FLAGS, dir_fd=dfd)
                except OSError as exc:
                    raise open_error(disk, os.path.join(base, name), exc, directory=False) from None
                try:
                    st = disk.fstat(fd)
                    if st.st_mode & 0o170077 != regular_private or st.st_nlink != 1 or st.st_uid != euid:
                        check_file_stat(os.path.join(base, name), st, euid)
                    if st.st_size > max_size:
                        full = os.path.join(base, name)
                        raise UnsafeStateError(full, "too_large", f"{st.st_size} > {max_size} bytes")
                    out.append((name, disk.pread(fd, st.st_size, 0)))
                finally:
                    disk.close(fd)
        finally:
            self.disk.close(dfd)
        return out

    def pread(self, handle: FileHandle, size: int, offset: int) -> bytes:
        return self.disk.pread(handle.fd, size, offset)

"""Process-lifetime ownership of a state directory: a ``flock`` on the directory itself and
SQLite's exclusive lock on ``owner.db``.

Both locks live in open descriptors; the OS releases them when the process dies, so there is
no stale pid file to clean. The SQLite lock is the one the format has always promised (older
builds take only that one, through SQLite). It is taken here through the disk seam, without
SQLite: the same POSIX record lock SQLite's unix VFS takes for an exclusive transaction, on
the bytes it locks (the pending, reserved and shared bytes at 1 GiB), so an older build's
``BEGIN EXCLUSIVE`` finds the file locked and this build finds an older build's lock. It belongs to the file ``owner.db``, so deleting that file would
let a second opener create a fresh one and lock it; the directory's own ``flock`` cannot be
removed that way, so a second opener, in another process or this one, gets
:class:`StoreLockedError` at once either way. The owner re-checks (:meth:`OwnershipLock.check`)
that both names still refer to what it locked; when one changed it must stop writing
(:class:`OwnershipLostError`), as PostgreSQL's postmaster does when its lock file changes.
"""

from __future__ import annotations

import threading

from ..disk import FileHandle, StateRoot, UnsafeStateError
from .errors import OwnershipLostError, StoreLockedError

OWNER_DB = "owner.db"
_GONE_TEXT = (
    b"afterword: the state directory that was here was moved away or removed while a host was\n"
    b"serving it. That host stopped. Put the directory back here, or delete this file to start\n"
    b"with a new, empty state directory (everything the old one acknowledged is then unknown).\n"
)
_held: set[tuple[int, int]] = set()
_held_lock = threading.Lock()


SQLITE_MAGIC = b"SQLite format 3\x00"
# SQLite's lock bytes (os_unix.c): PENDING_BYTE, then RESERVED_BYTE, then the 510 shared bytes.
SQLITE_LOCK_START = 0x40000000
SQLITE_LOCK_LENGTH = 2 + 510


def check_lock_file(root: StateRoot) -> tuple[int, int] | None:
    """What an owner's open demands of ``owner.db`` before it locks it, checked without
    locking it (the open and ``doctor`` both use this): the state-file rules
    (``UnsafeStateError``), and an SQLite database or an empty file (``bad_lock_file``).
    Returns the file's identity, or None when there is none.

    Opening and closing a descriptor of the file drops this process's SQLite lock on it, so
    an owner calls this only before it locks (the directory's own lock is not affected)."""
    if not root.exists(OWNER_DB):
        return None
    handle = root.open_file(OWNER_DB)
    try:
        head = root.pread(handle, len(SQLITE_MAGIC), 0)
    finally:
        root.close(handle)
    if head and head != SQLITE_MAGIC:
        raise UnsafeStateError(
            handle.path, "bad_lock_file", "not an SQLite database; remove it while no host runs"
        )
    return handle.dev, handle.ino


class OwnershipLock:
    def __init__(self, root: StateRoot, dir_lock: FileHandle, db_lock: FileHandle) -> None:
        self._root = root
        self._dir_lock: FileHandle | None = dir_lock
        self._db_lock: FileHandle | None = db_lock  # closing it drops the SQLite lock
        self._identity = (db_lock.dev, db_lock.ino)
        self.path = db_lock.path

    @classmethod
    def acquire(cls, root: StateRoot) -> OwnershipLock:
        try:
            dir_lock = root.lock_root()
        except BlockingIOError:
            raise StoreLockedError(
                f"{root.root}: state directory is owned by another process or open store "
                "(the lock on the directory itself is held)"
            ) from None
        try:
            db_lock = cls._lock_owner_db(root)
        except BaseException:
            root.close(dir_lock)
            raise
        return cls(root, dir_lock, db_lock)

    @staticmethod
    def _lock_owner_db(root: StateRoot) -> FileHandle:
        if not root.exists(OWNER_DB):
            handle = root.open_file(OWNER_DB, writable=True, create=True)
            root.fsync(handle)
            root.close(handle)
            root.sync_dir("")
        path = root.path(OWNER_DB)
        st = root.disk.lstat(path)
        identity = (st.st_dev, st.st_ino)
        # Claim before opening any descriptor of owner.db: closing one drops every POSIX lock
        # this process holds on the file, including the lock of a store already open here.
        with _held_lock:
            if identity in _held:
                raise StoreLockedError(f"{root.root}: already open in this process")
            _held.add(identity)
        try:
            if check_lock_file(root) != identity:  # fail-closed checks on the lock file itself
                raise UnsafeStateError(path, "identity_changed", "replaced while opening")
            handle = root.open_file(OWNER_DB, writable=True)
            try:
                if (handle.dev, handle.ino) != identity:
                    raise UnsafeStateError(path, "identity_changed", "replaced while opening")
                root.disk.lock_range(handle.fd, SQLITE_LOCK_START, SQLITE_LOCK_LENGTH)
            except (BlockingIOError, PermissionError):
                root.close(handle)
                raise StoreLockedError(
                    f"{root.root}: state directory is owned by another process (the SQLite lock "
                    f"of {path} is held)"
                ) from None
            except BaseException:
                root.close(handle)
                raise
        except BaseException:
            with _held_lock:
                _held.discard(identity)
            raise
        return handle

    def check(self) -> None:
        """Raise :class:`OwnershipLostError` unless the state directory and ``owner.db`` are
        still the ones this lock holds (a path re-check: a few ``lstat`` calls)."""
        if self._dir_lock is None:
            return
        try:
            self._check()
        except OSError as exc:  # cannot look (EACCES, EIO): ownership is no longer provable
            raise OwnershipLostError(self._root.root, f"cannot check it: {exc.strerror or exc}") from None

    def check_or_fail(self) -> None:
        """:meth:`check`, and on a loss mark the state root failed, so that every later write
        through it is refused (``disk_failed``), not only the one that noticed."""
        try:
            self.check()
        except OwnershipLostError as exc:
            self._root.fail(exc)
            raise

    def _check(self) -> None:
        assert self._dir_lock is not None
        try:
            self._root.check_root_identity(self._dir_lock)
        except UnsafeStateError as exc:
            detail = exc.detail or exc.rule
            if self._root.leave_gone_marker(_GONE_TEXT):
                detail += "; a file now stands at its path so that no new, empty one is created there"
            raise OwnershipLostError(self._root.root, detail) from None
        try:
            st = self._root.disk.lstat(self.path)
        except FileNotFoundError:
            raise OwnershipLostError(self.path, "the lock file was removed") from None
        if (st.st_dev, st.st_ino) != self._identity:
            raise OwnershipLostError(self.path, "the lock file was replaced")

    def release(self) -> None:
        if self._db_lock is not None:
            self._root.close(self._db_lock)
            self._db_lock = None
            with _held_lock:
                _held.discard(self._identity)
        if self._dir_lock is not None:
            self._root.close(self._dir_lock)
            self._dir_lock = None

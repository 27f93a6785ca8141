"""Process-lifetime ownership of a state directory through an SQLite exclusive lock.

The lock lives in an open SQLite connection; the OS releases it when the process dies, so
there is no stale pid file to clean. A second opener, in another process or this one, gets
:class:`StoreLockedError` at once.
"""

from __future__ import annotations

import os
import sqlite3
import threading

from ..disk import StateRoot, UnsafeStateError
from .errors import StoreLockedError

OWNER_DB = "owner.db"
_held: set[tuple[int, int]] = set()
_held_lock = threading.Lock()


class OwnershipLock:
    def __init__(self, conn: sqlite3.Connection, identity: tuple[int, int], path: str) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._identity = identity
        self.path = path

    @classmethod
    def acquire(cls, root: StateRoot) -> OwnershipLock:
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
            handle = root.open_file(OWNER_DB)  # fail-closed checks on the lock file itself
            try:
                if (handle.dev, handle.ino) != identity:
                    raise UnsafeStateError(path, "identity_changed", "replaced while opening")
            finally:
                root.close(handle)
            conn = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA locking_mode=EXCLUSIVE")
                conn.execute("PRAGMA journal_mode=MEMORY")
                conn.execute("BEGIN EXCLUSIVE")
                conn.execute("CREATE TABLE IF NOT EXISTS owner (pid INTEGER NOT NULL)")
                conn.execute("DELETE FROM owner")
                conn.execute("INSERT INTO owner (pid) VALUES (?)", (os.getpid(),))
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                conn.close()
                if "locked" in str(exc) or "busy" in str(exc):
                    raise StoreLockedError(
                        f"{root.root}: state directory is owned by another process"
                    ) from None
                raise UnsafeStateError(path, "bad_lock_file", type(exc).__name__) from None
            except sqlite3.DatabaseError:
                # Garbage in owner.db: it holds no state, but it is not ours to delete either.
                conn.close()
                raise UnsafeStateError(
                    path, "bad_lock_file", "not an SQLite database; remove it while no host runs"
                ) from None
        except BaseException:
            with _held_lock:
                _held.discard(identity)
            raise
        return cls(conn, identity, path)

    def release(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            with _held_lock:
                _held.discard(self._identity)

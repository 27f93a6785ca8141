"""Shared helpers for the durability-layer tests: disk snapshots and fault-injecting seams."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable

from afterword.disk import OsDisk
from afterword.store import Put, RecordStore, StoreOptions
from afterword.wal import WalOptions

MiB = 1024 * 1024

# Small, fast segments: tests never need the production 16 MiB zero-filled slots.
SMALL = StoreOptions(wal=WalOptions(segment_size=8 * MiB, max_payload=3 * MiB, zero_fill=False))

# The ownership lock rewrites owner.db (pid row, SQLite change counter) on every open attempt,
# so its bytes are not state. Its bytes are also never read here: opening and closing any
# descriptor of owner.db in a process drops that process's POSIX lock on it.
_LOCK_FILE = "owner.db"


def snapshot(root: str) -> dict[str, tuple[object, ...]]:
    """Everything observable about a tree without following links: type, mode, owner, links,
    size and a content hash per entry."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            content: object = None
            is_lock = name == _LOCK_FILE
            if stat.S_ISLNK(st.st_mode):
                content = os.readlink(full)
            elif stat.S_ISREG(st.st_mode) and not is_lock:
                with open(full, "rb") as fh:
                    content = hashlib.sha256(fh.read()).hexdigest()
            size = st.st_size if stat.S_ISREG(st.st_mode) and not is_lock else None
            kind, mode = stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode)
            out[rel] = (kind, mode, st.st_uid, st.st_nlink, size, content)
    return out


def populate(path: str, n: int = 3, options: StoreOptions = SMALL) -> dict[str, bytes]:
    """A closed store holding ``n`` checkpointed records (so record files exist) plus one
    record only in the WAL; returns the committed contents."""
    model: dict[str, bytes] = {}
    with RecordStore.open(path, options=options) as store:
        for i in range(n):
            key, value = f"rec:{i}", f"value-{i}".encode()
            store.transact_sync([Put(key, value)])
            model[key] = value
        store.checkpoint_sync()
        store.transact_sync([Put("wal:only", b"in the log")])
        model["wal:only"] = b"in the log"
    return model


def record_path(state: str, key: str) -> str:
    return os.path.join(state, "records", key.encode().hex() + ".rec")


def write_owner_only(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def replace_with_copy(path: str, aside: str | None = None) -> None:
    """Swap ``path`` for a byte-identical file on a new inode (0600, same owner).

    With ``aside`` the original inode is kept there (renamed, not unlinked).
    """
    with open(path, "rb") as fh:
        data = fh.read()
    temp = path + ".swap"
    write_owner_only(temp, data)
    if aside is not None:
        os.rename(path, aside)
    os.rename(temp, path)


class FaultyDisk(OsDisk):
    """The production seam with switchable EIO failures and call counters."""

    def __init__(self) -> None:
        self.fail_fsync = False
        self.fail_fdatasync = False
        self.fail_pwrite = False
        self.calls: dict[str, int] = {"fsync": 0, "fdatasync": 0, "pwrite": 0, "fsync_dir": 0}
        self.failures: dict[str, int] = {"fsync": 0, "fdatasync": 0, "pwrite": 0}

    def _eio(self, op: str) -> None:
        self.failures[op] += 1
        raise OSError(errno.EIO, f"injected {op} failure")

    def fsync(self, fd: int) -> None:
        self.calls["fsync"] += 1
        if self.fail_fsync:
            self._eio("fsync")
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self.calls["fdatasync"] += 1
        if self.fail_fdatasync:
            self._eio("fdatasync")
        super().fdatasync(fd)

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        self.calls["pwrite"] += 1
        if self.fail_pwrite:
            self._eio("pwrite")
        super().pwrite(fd, data, offset)

    def fsync_dir(self, path: str) -> None:
        self.calls["fsync_dir"] += 1
        super().fsync_dir(path)

    def syncs(self) -> int:
        return self.calls["fsync"] + self.calls["fdatasync"] + self.calls["fsync_dir"]


class RecordingDisk(OsDisk):
    """Records every ``pread`` size, and can run a hook before the next read."""

    def __init__(self) -> None:
        self.pread_sizes: list[int] = []
        self.before_pread: Callable[[], None] | None = None

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self.pread_sizes.append(size)
        hook, self.before_pread = self.before_pread, None
        if hook is not None:
            hook()
        return super().pread(fd, size, offset)


def abandon(store: RecordStore) -> None:
    """Drop ``store`` the way a killed process would: descriptors and the lock go, but none
    of a clean close's work (its MANIFEST update) happens."""
    store._closed = True
    store.wal.close()
    if store._lock is not None:
        store._lock.release()
        store._lock = None

"""The outbox file: one JSON line per delivered chunk, appended with group commit.

Concurrent appends (workers delivering at the same time) share one ``pwrite`` and one
``fdatasync``: an append joins the queue, the first caller to take the flush lock writes every
queued line in one go, and each caller returns only once the fdatasync covering its line
succeeded. A failed write or fdatasync fails every append in that batch and fails the file for
good: an fdatasync is never retried, because after a failure the kernel may have dropped the
dirty pages and a second fdatasync could report success for data that is gone. Every disk
effect goes through the :class:`~afterword.disk.Disk` seam.

A batch of one post (a lone producer) is written on the event loop itself, without the two
thread hand-offs, while the running estimate of one write+fdatasync stays under
``INLINE_MAX_S``: the loop then stalls for about that long at most, and a slow disk sends the
writes back to a worker thread by itself. The estimate is first taken off the loop (the first
write may create the file and sync its directory), and the same failure rules hold inline.

The file also answers "does it hold this delivery key?", from an index of the keys it holds,
kept current with appends made by anyone (two channel keys can share one file) and reset
when the file is replaced (rotation).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Sequence

import anyio
import anyio.lowlevel
import msgspec

from ..disk import Disk
from .errors import WorkerError

_INDEX_READ = 1 << 20
INLINE_MAX_S = 0.0005  # the longest write+fdatasync estimate a lone post is written inline at
_EWMA = 0.2  # weight of the newest write time in the running estimate


class OutboxNotWritten(WorkerError):
    """The append failed before anything was written (opening or reading the file)."""


class OutboxUnsynced(WorkerError):
    """The write or its fdatasync failed: the line may be in the file but is not proven
    durable, and the file takes no more appends until it is reopened (a restart)."""


class OutboxFailed(WorkerError):
    """An earlier write or fdatasync failed; nothing was written for this append."""


class _Entry:
    __slots__ = ("done", "error", "key", "line")

    def __init__(self, key: str, line: bytes) -> None:
        self.key = key
        self.line = line
        self.done = False
        self.error: Exception | None = None


class OutboxFile:
    def __init__(self, path: str, disk: Disk) -> None:
        self.path = os.path.abspath(path)
        self._disk = disk
        self._lock = threading.Lock()  # the index and the file, between worker threads
        self._queue: list[_Entry] = []
        self._flush: anyio.Lock | None = None  # made in the loop that first appends
        self._failed: OSError | None = None
        self._dir_synced = False
        self._keys: set[str] = set()
        self._indexed: tuple[int, int, int] | None = None  # (st_dev, st_ino, bytes indexed)
        self.batches = 0  # write+fdatasync rounds, for tests and benchmarks
        self.inline_batches = 0  # of which written on the event loop
        self.inline_max_s = INLINE_MAX_S
        self.recent_write_s: float | None = None  # running estimate, None until measured

    async def append(self, key: str, line: bytes) -> None:
        """Make ``line`` (one newline-terminated JSON line for ``key``) durable in the file, or
        do nothing when the file already holds ``key``. Raises :class:`OutboxNotWritten`,
        :class:`OutboxUnsynced` or :class:`OutboxFailed`."""
        entry = _Entry(key, line)
        self._queue.append(entry)
        if self._flush is None:
            self._flush = anyio.Lock()
        try:
            async with self._flush:
                if not entry.done:
                    # Let the appends already runnable in this loop tick join the batch.
                    await anyio.lowlevel.cancel_shielded_checkpoint()
                    batch, self._queue = self._queue, []
                    if not self._write_inline(batch):
                        await anyio.to_thread.run_sync(self._write_batch, batch)
        except BaseException:
            if entry in self._queue:  # cancelled before any batch took it: never written
                self._queue.remove(entry)
            raise
        if entry.error is not None:
            raise entry.error

    def _write_inline(self, batch: list[_Entry]) -> bool:
        """Write a lone post's batch on the loop if the recent write time allows it and no
        worker thread holds the file; False when the caller must use a thread instead."""
        recent = self.recent_write_s
        if len(batch) != 1 or recent is None or recent > self.inline_max_s:
            return False
        if not self._lock.acquire(blocking=False):  # present() is reading: never wait on the loop
            return False
        try:
            self.inline_batches += 1
            self._write_batch(batch, locked=True)
        finally:
            self._lock.release()
        return True

    def _write_batch(self, batch: list[_Entry], *, locked: bool = False) -> None:
        """Write the batch's new lines with one pwrite and one fdatasync (in a worker thread,
        or inline with the lock already held). Sets each entry's outcome; never raises."""
        try:
            if locked:
                self._write_locked(batch)
            else:
                with self._lock:
                    self._write_locked(batch)
        except Exception as exc:  # a bug must not strand the callers: fail them all, unproven
            for entry in batch:
                if not entry.done and entry.error is None:
                    entry.error = OutboxUnsynced(f"{type(exc).__name__}")
        for entry in batch:
            if entry.error is None:
                entry.done = True

    def _write_locked(self, batch: list[_Entry]) -> None:
        if self._failed is not None:
            for entry in batch:
                entry.error = OutboxFailed(self._failed.strerror or type(self._failed).__name__)
            return
        disk = self._disk
        try:
            fd = disk.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            _fail_all(batch, OutboxNotWritten(exc.strerror or type(exc).__name__))
            return
        try:
            try:
                st = disk.fstat(fd)
                offset = st.st_size
                self._refresh(fd, offset, st)
                # Never glue a line onto a torn, unconfirmed one.
                prefix = b"\n" if offset and disk.pread(fd, 1, offset - 1) != b"\n" else b""
            except OSError as exc:
                _fail_all(batch, OutboxNotWritten(exc.strerror or type(exc).__name__))
                return
            new: list[_Entry] = []
            keys: set[str] = set()
            for entry in batch:
                if entry.key not in self._keys and entry.key not in keys:  # else already posted
                    keys.add(entry.key)
                    new.append(entry)
            if not new:
                return
            data = prefix + b"".join(e.line for e in new)
            began = time.perf_counter()
            try:
                disk.pwrite(fd, data, offset)
                disk.fdatasync(fd)
                if not self._dir_synced:
                    # The file may have just been created: its name must be durable too.
                    disk.fsync_dir(os.path.dirname(self.path))
                    self._dir_synced = True
            except OSError as exc:
                self._failed = exc
                # Every append of those keys shares the outcome (a key posted twice at once too).
                _fail_all(
                    (e for e in batch if e.key in keys), OutboxUnsynced(exc.strerror or type(exc).__name__)
                )
                return
            elapsed = time.perf_counter() - began  # a failed sync needs no estimate: no more writes
            recent = self.recent_write_s
            self.recent_write_s = elapsed if recent is None else recent + _EWMA * (elapsed - recent)
            self.batches += 1
            self._keys.update(keys)
            if self._indexed == (st.st_dev, st.st_ino, offset):
                # The index was current up to our write: our own lines need no reading back.
                self._indexed = (st.st_dev, st.st_ino, offset + len(data))
        finally:
            try:
                disk.close(fd)
            except OSError:
                pass  # the outcome was decided by the fdatasync; a close error changes nothing

    def _refresh(self, fd: int, size: int, st: os.stat_result) -> None:
        """Bring the key index up to the file's current content (lock held).

        Another writer may have appended, and the file may have been replaced or truncated
        (rotation): read the new tail, or start over.
        """
        start = 0
        if self._indexed is not None:
            dev, ino, done = self._indexed
            if (dev, ino) == (st.st_dev, st.st_ino) and done <= size:
                start = done
            else:
                self._keys.clear()
        pos, carry = start, b""
        while pos < size:
            block = self._disk.pread(fd, min(_INDEX_READ, size - pos), pos)
            if not block:
                break
            pos += len(block)
            data = carry + block
            end = data.rfind(b"\n") + 1  # a line without its newline was never confirmed
            self._keys.update(_keys_of(data[:end].split(b"\n")))
            carry = data[end:]
        self._indexed = (st.st_dev, st.st_ino, pos - len(carry))

    def present(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` the file holds (blocking: run it in a worker thread)."""
        with self._lock:
            try:
                fd = self._disk.open(self.path, os.O_RDONLY | os.O_NOFOLLOW, 0)
            except FileNotFoundError:
                self._keys.clear()
                self._indexed = None
                return set()
            try:
                st = self._disk.fstat(fd)
                self._refresh(fd, st.st_size, st)
            finally:
                self._disk.close(fd)
            return {k for k in keys if k in self._keys}


def _fail_all(entries: Iterable[_Entry], error: Exception) -> None:
    for entry in entries:
        entry.error = error


class _KeyOnly(msgspec.Struct, rename="camel"):
    delivery_key: str


_key_decoder = msgspec.json.Decoder(_KeyOnly)


def _keys_of(lines: Iterable[bytes]) -> Iterable[str]:
    for raw in lines:
        if not raw.strip():
            continue
        try:
            yield _key_decoder.decode(raw).delivery_key
        except msgspec.DecodeError:
            continue  # a foreign or damaged line proves nothing

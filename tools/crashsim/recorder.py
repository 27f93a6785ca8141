"""A recording ``Disk``: performs every call through a real seam and logs what it changed.

The log is what a crash simulator needs to rebuild any state a power loss could leave: each
mutating call as a replayable operation (files named by a logical inode number, so renames
and unlinks stay unambiguous), each fsync barrier, and marks the workload adds in between
(which operation began, which was acknowledged). Paths are relative to ``base``; calls
outside ``base`` are performed but not logged. The files under ``base`` when recording starts
are the baseline: they count as durable.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from dataclasses import dataclass

import msgspec

from afterword.disk import Disk, OsDisk


class Create(msgspec.Struct, frozen=True, tag=True):
    """A new regular file ``dir/name`` bound to inode ``ino`` (a directory change)."""

    dir: str
    name: str
    ino: int


class Mkdir(msgspec.Struct, frozen=True, tag=True):
    dir: str
    name: str


class Rmdir(msgspec.Struct, frozen=True, tag=True):
    dir: str
    name: str


class Rename(msgspec.Struct, frozen=True, tag=True):
    """``src_dir/src_name`` (inode ``ino``) now also answers to ``dst_dir/dst_name``."""

    src_dir: str
    src_name: str
    dst_dir: str
    dst_name: str
    ino: int


class Unlink(msgspec.Struct, frozen=True, tag=True):
    dir: str
    name: str
    ino: int


class Write(msgspec.Struct, frozen=True, tag=True):
    ino: int
    offset: int
    data: bytes


class Truncate(msgspec.Struct, frozen=True, tag=True):
    ino: int
    length: int


class Fallocate(msgspec.Struct, frozen=True, tag=True):
    ino: int
    offset: int
    length: int


class Sync(msgspec.Struct, frozen=True, tag=True):
    """fsync (``data_only=False``) or fdatasync of one file: a barrier for its data."""

    ino: int
    data_only: bool


class SyncDir(msgspec.Struct, frozen=True, tag=True):
    """fsync of a directory: a barrier for the entries created, renamed or removed in it."""

    dir: str


class Mark(msgspec.Struct, frozen=True, tag=True):
    """A workload event between disk operations: ``begin``/``ack``/``fail`` of op ``op``,
    or ``note``/``fault`` with free text."""

    kind: str
    op: int
    note: str = ""


DirOp = Create | Mkdir | Rmdir | Rename | Unlink
DataOp = Write | Truncate | Fallocate
Barrier = Sync | SyncDir
DiskOp = DirOp | DataOp | Barrier
Entry = DiskOp | Mark


class BaseFile(msgspec.Struct, frozen=True):
    path: str
    ino: int
    data: bytes


class Baseline(msgspec.Struct, frozen=True):
    """The tree under ``base`` when recording began (``""`` is ``base`` itself)."""

    dirs: tuple[str, ...]
    files: tuple[BaseFile, ...]


class Recording(msgspec.Struct, frozen=True):
    baseline: Baseline
    entries: tuple[Entry, ...]

    def disk_ops(self) -> list[DiskOp]:
        return [e for e in self.entries if not isinstance(e, Mark)]

    def fingerprint(self) -> str:
        """A digest of the log's shape, equal for two recordings of the same workload run.

        Bytes written are left out (segment salts, secrets and generation ids are random
        per run) but their offsets and lengths are in; temporary-file names are numbered by
        first appearance because they embed the pid and a process-wide counter.
        """
        names: dict[str, str] = {}

        def canon(name: str) -> str:
            found = _TEMP_SUFFIX.search(name)
            if found is None:
                return name
            return names.setdefault(name, f"{name[: found.start()]}~{len(names)}")

        h = hashlib.sha256()
        for entry in self.entries:
            if isinstance(entry, Write):
                shape: tuple[object, ...] = ("W", entry.ino, entry.offset, len(entry.data))
            elif isinstance(entry, Create | Unlink | Mkdir | Rmdir):
                shape = (type(entry).__name__, entry.dir, canon(entry.name))
            elif isinstance(entry, Rename):
                shape = ("R", entry.src_dir, canon(entry.src_name), entry.dst_dir, canon(entry.dst_name))
            elif isinstance(entry, Mark):
                shape = ("M", entry.kind, entry.op)  # notes may quote random values
            else:
                shape = (type(entry).__name__, *msgspec.structs.astuple(entry))
            h.update(repr(shape).encode())
        return h.hexdigest()[:16]


_TEMP_SUFFIX = re.compile(r"-\d+-\d+$")
_recording_encoder = msgspec.msgpack.Encoder()
_recording_decoder = msgspec.msgpack.Decoder(Recording)


def encode_recording(recording: Recording) -> bytes:
    return _recording_encoder.encode(recording)


def decode_recording(data: bytes) -> Recording:
    return _recording_decoder.decode(data)


class RecordingError(Exception):
    """The code under test used the seam in a way the simulator does not model."""


@dataclass
class _Open:
    path: str  # absolute path at open time
    rel: str | None  # relative to base, None outside it
    ino: int | None  # logical inode, None for directories


def _split(rel: str) -> tuple[str, str]:
    head, _, name = rel.rpartition("/")
    return head, name


class Recorder:
    """A ``Disk`` that delegates to ``inner`` and logs every change under ``base``.

    Thread-safe: the write-ahead log's leader writes from a worker thread, so each call and
    its log entry happen under one lock and the log order is the order the calls took effect.
    """

    def __init__(self, base: str, inner: Disk | None = None) -> None:
        self.base = os.path.abspath(base)
        self.inner: Disk = inner if inner is not None else OsDisk()
        self._lock = threading.RLock()
        self._entries: list[Entry] = []
        self._inodes: dict[tuple[int, int], int] = {}
        self._next_ino = 1
        self._fds: dict[int, _Open] = {}
        self.baseline = self._scan()

    # -- bookkeeping -------------------------------------------------------------------------
    def _scan(self) -> Baseline:
        dirs = [""]
        files: list[BaseFile] = []
        for dirpath, dirnames, filenames in os.walk(self.base):
            dirnames.sort()
            for name in dirnames:
                dirs.append(self._rel_required(os.path.join(dirpath, name)))
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                st = os.lstat(full)
                if not stat.S_ISREG(st.st_mode):
                    raise RecordingError(f"{full}: only regular files and directories are modelled")
                with open(full, "rb") as fh:
                    data = fh.read()
                files.append(BaseFile(self._rel_required(full), self._bind(st), data))
        return Baseline(tuple(dirs), tuple(files))

    def _rel(self, full: str) -> str | None:
        rel = os.path.relpath(os.path.abspath(full), self.base)
        if rel == ".":
            return ""
        if rel == ".." or rel.startswith("../"):
            return None
        return rel

    def _rel_required(self, full: str) -> str:
        rel = self._rel(full)
        assert rel is not None
        return rel

    def _bind(self, st: os.stat_result) -> int:
        ino = self._next_ino
        self._next_ino += 1
        self._inodes[(st.st_dev, st.st_ino)] = ino
        return ino

    def _lookup(self, st: os.stat_result) -> int:
        ino = self._inodes.get((st.st_dev, st.st_ino))
        return ino if ino is not None else self._bind(st)

    def _log(self, entry: Entry) -> None:
        self._entries.append(entry)

    def _file(self, fd: int) -> _Open | None:
        """The tracked file behind ``fd`` when it lies under ``base``."""
        handle = self._fds.get(fd)
        if handle is None or handle.rel is None:
            return None
        return handle

    def mark(self, kind: str, op: int, note: str = "") -> None:
        with self._lock:
            self._log(Mark(kind, op, note))

    def recording(self) -> Recording:
        with self._lock:
            return Recording(self.baseline, tuple(self._entries))

    # -- the Disk protocol -------------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        with self._lock:
            if dir_fd is not None and not os.path.isabs(path):
                parent = self._fds.get(dir_fd)
                if parent is None:
                    raise RecordingError("open relative to a descriptor the recorder never saw")
                full = os.path.join(parent.path, path)
            else:
                full = path
            existed = True
            if flags & os.O_CREAT:
                existed = os.path.lexists(full)
            fd = self.inner.open(path, flags, mode, dir_fd=dir_fd)
            st = self.inner.fstat(fd)
            rel = self._rel(full)
            if stat.S_ISDIR(st.st_mode):
                self._fds[fd] = _Open(full, rel, None)
                return fd
            ino = self._lookup(st) if existed else self._bind(st)
            self._fds[fd] = _Open(full, rel, ino)
            if rel is not None:
                if not existed:
                    self._log(Create(*_split(rel), ino))
                if flags & os.O_TRUNC:
                    self._log(Truncate(ino, 0))
            return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._fds.pop(fd, None)
            self.inner.close(fd)

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        with self._lock:
            self.inner.pwrite(fd, data, offset)
            handle = self._file(fd)
            if handle is not None and handle.ino is not None:
                self._log(Write(handle.ino, offset, bytes(data)))

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return self.inner.pread(fd, size, offset)

    def fsync(self, fd: int) -> None:
        with self._lock:
            self.inner.fsync(fd)
            self._log_sync(fd, data_only=False)

    def fdatasync(self, fd: int) -> None:
        with self._lock:
            self.inner.fdatasync(fd)
            self._log_sync(fd, data_only=True)

    def _log_sync(self, fd: int, *, data_only: bool) -> None:
        handle = self._file(fd)
        if handle is None:
            return
        if handle.ino is None:
            assert handle.rel is not None
            self._log(SyncDir(handle.rel))
        else:
            self._log(Sync(handle.ino, data_only))

    def ftruncate(self, fd: int, length: int) -> None:
        with self._lock:
            self.inner.ftruncate(fd, length)
            handle = self._file(fd)
            if handle is not None and handle.ino is not None:
                self._log(Truncate(handle.ino, length))

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        with self._lock:
            self.inner.fallocate(fd, offset, length)
            handle = self._file(fd)
            if handle is not None and handle.ino is not None:
                self._log(Fallocate(handle.ino, offset, length))

    def fstat(self, fd: int) -> os.stat_result:
        return self.inner.fstat(fd)

    def lstat(self, path: str) -> os.stat_result:
        return self.inner.lstat(path)

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            src_rel, dst_rel = self._rel(src), self._rel(dst)
            st = self.inner.lstat(src)
            if stat.S_ISDIR(st.st_mode) and (src_rel is not None or dst_rel is not None):
                raise RecordingError(f"rename of directory {src}: not modelled")
            self.inner.rename(src, dst)
            if src_rel is None or dst_rel is None:
                if src_rel is not None or dst_rel is not None:
                    raise RecordingError(f"rename across the recorded tree: {src} -> {dst}")
                return
            self._log(Rename(*_split(src_rel), *_split(dst_rel), self._lookup(st)))

    def unlink(self, path: str) -> None:
        with self._lock:
            rel = self._rel(path)
            st = self.inner.lstat(path) if rel is not None else None
            self.inner.unlink(path)
            if rel is not None and st is not None:
                self._log(Unlink(*_split(rel), self._lookup(st)))

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        with self._lock:
            self.inner.mkdir(path, mode)
            rel = self._rel(path)
            if rel:
                self._log(Mkdir(*_split(rel)))

    def rmdir(self, path: str) -> None:
        with self._lock:
            self.inner.rmdir(path)
            rel = self._rel(path)
            if rel:
                self._log(Rmdir(*_split(rel)))

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def fsync_dir(self, path: str) -> None:
        with self._lock:
            self.inner.fsync_dir(path)
            rel = self._rel(path)
            if rel is not None:
                self._log(SyncDir(rel))

    def flock(self, fd: int, operation: int) -> None:
        # A lock is no state: nothing of it survives a crash, so nothing is recorded.
        self.inner.flock(fd, operation)

    def lock_range(self, fd: int, start: int, length: int) -> None:
        self.inner.lock_range(fd, start, length)  # no state either, as flock

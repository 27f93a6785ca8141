"""The one syscall seam. Every byte that reaches the disk passes through a ``Disk``.

Production code uses :class:`OsDisk`; the crash simulator substitutes a recording
implementation with the same methods. Paths are absolute strings; ``dir_fd`` mirrors
``os.open`` so callers can walk a tree without following links.
"""

from __future__ import annotations

import fcntl
import os
from typing import Protocol


class Disk(Protocol):
    """The primitive file-system operations the durability layer is allowed to use."""

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int: ...

    def close(self, fd: int) -> None: ...

    def pwrite(self, fd: int, data: bytes, offset: int) -> None: ...

    def pread(self, fd: int, size: int, offset: int) -> bytes: ...

    def fsync(self, fd: int) -> None: ...

    def fdatasync(self, fd: int) -> None: ...

    def ftruncate(self, fd: int, length: int) -> None: ...

    def fallocate(self, fd: int, offset: int, length: int) -> None: ...

    def fstat(self, fd: int) -> os.stat_result: ...

    def lstat(self, path: str) -> os.stat_result: ...

    def rename(self, src: str, dst: str) -> None: ...

    def unlink(self, path: str) -> None: ...

    def mkdir(self, path: str, mode: int = 0o700) -> None: ...

    def rmdir(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]: ...

    def fsync_dir(self, path: str) -> None: ...

    def flock(self, fd: int, operation: int) -> None: ...

    def lock_range(self, fd: int, start: int, length: int) -> None:
        """An exclusive, non-blocking POSIX record lock on ``length`` bytes from ``start``
        (``BlockingIOError`` or ``PermissionError`` while another process holds one)."""
        ...


class OsDisk:
    """The production seam: thin wrappers over ``os``."""

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode, dir_fd=dir_fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            if written <= 0:  # pragma: no cover - the kernel never returns 0 for regular files
                raise OSError("short write")
            view = view[written:]
            offset += written

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        chunks: list[bytes] = []
        while size > 0:
            chunk = os.pread(fd, size, offset)
            if not chunk:
                break
            chunks.append(chunk)
            size -= len(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        os.posix_fallocate(fd, offset, length)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def lstat(self, path: str) -> os.stat_result:
        return os.lstat(path)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        os.mkdir(path, mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def flock(self, fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)

    def lock_range(self, fd: int, start: int, length: int) -> None:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start)


class NoSyncDisk(OsDisk):
    """Test and benchmark hook: the production seam with every flush removed.

    Exported on purpose (as etcd exports its unsafe no-fsync option) so tests that make
    their own crashes, and fixtures built for benchmarks, do not pay for fsyncs. Never use
    it for data that must survive a power loss.
    """

    def fsync(self, fd: int) -> None:
        return None

    def fdatasync(self, fd: int) -> None:
        return None

    def fsync_dir(self, path: str) -> None:
        return None

"""I/O-error injection: a ``Disk`` that fails the Nth call of one kind, once or from then on.

Kinds (what is counted and failed):

``write``     pwrite
``fsync``     fsync and fdatasync of files
``dirsync``   fsync of a directory
``rename``    rename
``truncate``  ftruncate and fallocate (ENOSPC is the realistic case)
``create``    open with O_CREAT (ENOSPC/EDQUOT when a directory block or inode is needed)

The first three are *durability* failures: the layer must refuse to acknowledge anything
afterwards until the state is reopened. The others may be survived, but must never cost an
acknowledged operation.
"""

from __future__ import annotations

import errno as errno_mod
import os
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from afterword.disk import Disk, OsDisk

KINDS: tuple[str, ...] = ("write", "fsync", "dirsync", "rename", "truncate", "create")
DURABILITY_KINDS = frozenset({"write", "fsync", "dirsync"})
ERRNOS: dict[str, int] = {"EIO": errno_mod.EIO, "ENOSPC": errno_mod.ENOSPC}


@dataclass(frozen=True)
class FaultPlan:
    kind: str
    nth: int  # 1-based count of calls of this kind
    errno: str  # "EIO" or "ENOSPC"
    persistent: bool  # every later call of the kind fails too

    @property
    def ident(self) -> str:
        return f"{self.kind}#{self.nth}:{self.errno}:{'persistent' if self.persistent else 'once'}"

    @classmethod
    def parse(cls, ident: str) -> FaultPlan:
        try:
            head, err, mode = ident.split(":")
            kind, _, nth = head.partition("#")
            plan = cls(kind, int(nth), err, mode == "persistent")
        except ValueError:
            raise ValueError(
                f"bad fault plan {ident!r}; expected kind#N:EIO|ENOSPC:once|persistent"
            ) from None
        if kind not in KINDS or err not in ERRNOS or mode not in ("once", "persistent") or plan.nth < 1:
            raise ValueError(f"bad fault plan {ident!r}")
        return plan


class FaultyDisk:
    """Delegates to ``inner``; counts calls per kind and fails the ones ``plan`` names.

    With ``plan=None`` it only counts (to learn how many calls of each kind a run makes).
    ``on_fault`` is told before each injected failure, so the failure lands in the log.
    """

    def __init__(
        self,
        inner: Disk | None = None,
        plan: FaultPlan | None = None,
        on_fault: Callable[[str], None] | None = None,
    ) -> None:
        self.inner: Disk = inner if inner is not None else OsDisk()
        self.plan = plan
        self.on_fault = on_fault
        self.counts: Counter[str] = Counter()
        self.injected = 0

    def _call(self, kind: str, what: str) -> None:
        self.counts[kind] += 1
        plan = self.plan
        if plan is None or plan.kind != kind:
            return
        n = self.counts[kind]
        if n == plan.nth or (plan.persistent and n > plan.nth):
            self.injected += 1
            if self.on_fault is not None:
                self.on_fault(f"{plan.errno} on {kind} #{n} ({what})")
            code = ERRNOS[plan.errno]
            raise OSError(code, os.strerror(code), what)

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        if flags & os.O_CREAT:
            self._call("create", path)
        return self.inner.open(path, flags, mode, dir_fd=dir_fd)

    def close(self, fd: int) -> None:
        self.inner.close(fd)

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        self._call("write", f"fd {fd} [{offset}+{len(data)}]")
        self.inner.pwrite(fd, data, offset)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return self.inner.pread(fd, size, offset)

    def fsync(self, fd: int) -> None:
        self._call("fsync", f"fd {fd}")
        self.inner.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._call("fsync", f"fd {fd} (fdatasync)")
        self.inner.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        self._call("truncate", f"fd {fd} to {length}")
        self.inner.ftruncate(fd, length)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        self._call("truncate", f"fd {fd} fallocate [{offset}+{length}]")
        self.inner.fallocate(fd, offset, length)

    def fstat(self, fd: int) -> os.stat_result:
        return self.inner.fstat(fd)

    def lstat(self, path: str) -> os.stat_result:
        return self.inner.lstat(path)

    def rename(self, src: str, dst: str) -> None:
        self._call("rename", os.path.basename(dst))
        self.inner.rename(src, dst)

    def unlink(self, path: str) -> None:
        self.inner.unlink(path)

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        self.inner.mkdir(path, mode)

    def rmdir(self, path: str) -> None:
        self.inner.rmdir(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def fsync_dir(self, path: str) -> None:
        self._call("dirsync", os.path.basename(path) or path)
        self.inner.fsync_dir(path)

    def flock(self, fd: int, operation: int) -> None:
        self.inner.flock(fd, operation)

    def lock_range(self, fd: int, start: int, length: int) -> None:
        self.inner.lock_range(fd, start, length)


def plans(
    counts: Counter[str], *, budget: int | None, rng: random.Random, kinds: Sequence[str] = KINDS
) -> tuple[list[FaultPlan], bool]:
    """Every plan for the calls a clean run makes (True), or a seeded sample of ``budget``
    spread evenly over the kinds (False)."""
    every = [
        FaultPlan(kind, n, err, persistent)
        for kind in kinds
        for n in range(1, counts[kind] + 1)
        for persistent in (False, True)
        for err in ERRNOS
    ]
    if budget is None or len(every) <= budget:
        return every, True
    by_kind: dict[str, list[FaultPlan]] = {}
    for plan in every:
        by_kind.setdefault(plan.kind, []).append(plan)
    picked: list[FaultPlan] = []
    pools = [rng.sample(pool, len(pool)) for _, pool in sorted(by_kind.items())]
    while len(picked) < budget and any(pools):
        for pool in pools:
            if pool and len(picked) < budget:
                picked.append(pool.pop())
    return picked, False

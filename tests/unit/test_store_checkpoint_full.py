"""A commit is durable before its automatic checkpoint runs: when that checkpoint finds the
disk full, the commit still succeeds (found by the job queue's crash workload, plan
``write#29:ENOSPC:once``: the lease committed, then ``transact`` raised ``StorageFullError``,
whose message says "free space and retry", for a transaction that was already written)."""

from __future__ import annotations

import dataclasses
import errno

import pytest

from afterword.disk import OsDisk
from afterword.store import Put, RecordStore, StoreOptions
from afterword.wal import WalOptions

OPTIONS = StoreOptions(
    wal=WalOptions(segment_size=64 * 1024, max_payload=4096, max_log_bytes=8192, zero_fill=True),
    auto_checkpoint=False,
)


class GrowthRefused(OsDisk):
    """While ``full``: writing a new record file (what a checkpoint does) fails with ENOSPC."""

    full = False

    def __init__(self) -> None:
        self.record_fds: set[int] = set()

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        fd = super().open(path, flags, mode, dir_fd=dir_fd)
        if ".rec.tmp-" in path:
            self.record_fds.add(fd)
        return fd

    def close(self, fd: int) -> None:
        self.record_fds.discard(fd)
        super().close(fd)

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        if self.full and fd in self.record_fds:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().pwrite(fd, data, offset)


def _full_log(state_dir: str, disk: GrowthRefused) -> RecordStore:
    store = RecordStore.open(state_dir, disk=disk, options=OPTIONS)
    n = 0
    while not store.wal.needs_checkpoint:
        store.transact_sync([Put(f"k/{n}", b"x" * 500)])
        n += 1
    store.options = dataclasses.replace(OPTIONS, auto_checkpoint=True)
    disk.full = True
    return store


@pytest.mark.anyio
async def test_a_commit_whose_checkpoint_finds_no_space_still_succeeds(state_dir: str) -> None:
    disk = GrowthRefused()
    store = _full_log(state_dir, disk)
    try:
        lsn = await store.transact([Put("after", b"1")])
        sync_lsn = store.transact_sync([Put("after-sync", b"2")])
        assert store.get("after").lsn == lsn and store.get("after-sync").lsn == sync_lsn  # type: ignore[union-attr]
        assert store.root.failed is None and store.statistics().checkpoints == 0
        disk.full = False
        await store.transact([Put("later", b"3")])  # the next commit checkpoints
        assert store.statistics().checkpoints == 1
    finally:
        store.close()
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        assert {"after", "after-sync", "later"} <= {r.key for r in store.items()}

"""Commits are not held while a checkpoint writes its record files."""

from __future__ import annotations

import os
import threading

import anyio
import pytest

from afterword.disk import OsDisk
from afterword.store import Put, RecordStore, StoreOptions
from afterword.wal import WalOptions

pytestmark = pytest.mark.anyio


class BlockRecordFsync(OsDisk):
    """fsync of a record file waits until the test releases it."""

    def __init__(self) -> None:
        self.armed = False
        self.reached = threading.Event()
        self.release = threading.Event()

    def fsync(self, fd: int) -> None:
        if self.armed and "/records/" in os.readlink(f"/proc/self/fd/{fd}"):
            self.reached.set()
            self.release.wait(timeout=30)
        super().fsync(fd)


async def test_commit_completes_while_checkpoint_writes(state_dir: str) -> None:
    disk = BlockRecordFsync()
    options = StoreOptions(
        wal=WalOptions(segment_size=1 << 20, max_payload=64 * 1024, zero_fill=False),
        auto_checkpoint=False,
        checkpoint_threads=1,
    )
    store = RecordStore.open(state_dir, disk=disk, options=options)
    try:
        for i in range(20):
            await store.transact([Put(f"k/{i}", b"v%d" % i)])
        disk.armed = True
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.checkpoint)
            await anyio.to_thread.run_sync(disk.reached.wait, 10)
            assert disk.reached.is_set()
            with anyio.fail_after(5):  # would hang if the checkpoint held commits
                late = await store.transact([Put("late", b"during")])
            disk.release.set()
        assert store.manifest.checkpoint_lsn < late
    finally:
        disk.release.set()
        store.close()
    with RecordStore.open(state_dir, options=options) as again:
        assert again.get("late") is not None and again.get("k/19") is not None
        assert again.replayed == 1  # only the commit made during the checkpoint

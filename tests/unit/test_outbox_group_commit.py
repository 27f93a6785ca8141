"""The outbox shares one write and one fdatasync among concurrent posts (group commit).

Each post is acknowledged only after the fdatasync covering its line succeeded; a failed
fdatasync fails every post of its batch and is never retried (the file takes no more posts
until it is reopened); lines keep their order and each delivery key is written once. The
disk is a counting seam whose first fdatasync can be held, so a batch forms behind it.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import anyio
import pytest

from afterword.disk import OsDisk
from afterword.worker import ChunkDelivery, ChunkReceipt, OutboxChannel
from afterword.worker.errors import RetryableDeliveryError, UnconfirmedDeliveryError


class GatedDisk(OsDisk):
    """Counts writes and fdatasyncs; holds the first fdatasync until released; can fail the
    fdatasync number ``fail_at`` (1-based) with EIO, or every open with ``fail_open``."""

    def __init__(self, *, fail_at: int | None = None) -> None:
        self.pwrites = 0
        self.fdatasyncs = 0
        self.fail_at = fail_at
        self.fail_open = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        if self.fail_open and flags & os.O_CREAT:
            raise OSError(errno.EACCES, "Permission denied")
        return super().open(path, flags, mode, dir_fd=dir_fd)

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        self.pwrites += 1
        super().pwrite(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        self.fdatasyncs += 1
        if self.fdatasyncs == 1:
            self.entered.set()
            self.release.wait(10)
        if self.fdatasyncs == self.fail_at:
            raise OSError(errno.EIO, "Input/output error")
        super().fdatasync(fd)


def delivery(key: str) -> ChunkDelivery:
    return ChunkDelivery(delivery_key=key, conversation_id="local:x", chunk_index=0, chunk_count=1, text=key)


def keys_in(path: Path) -> list[str]:
    return [json.loads(line)["deliveryKey"] for line in path.read_text().splitlines()]


async def _held_then_batched(
    outbox: OutboxChannel, disk: GatedDisk, keys: list[str]
) -> tuple[dict[str, ChunkReceipt | Exception], list[str]]:
    """Post "first:0" and hold its fdatasync; post ``keys`` meanwhile, in order; then release.
    Returns each post's outcome and the keys whose post returned while the sync was held."""
    outcomes: dict[str, ChunkReceipt | Exception] = {}
    early: list[str] = []

    async def post(key: str) -> None:
        try:
            outcomes[key] = await outbox.post(delivery(key))
        except Exception as exc:
            outcomes[key] = exc
        if not disk.release.is_set():
            early.append(key)

    queued = 0
    all_queued = anyio.Event()
    append = outbox.file.append

    async def counting_append(key: str, line: bytes) -> None:
        # append queues its entry before its first await (the flush lock, held by "first:0"),
        # so the gate opens only once every later post waits in the queue behind the batch.
        nonlocal queued
        queued += 1
        if queued == len(keys):
            all_queued.set()
        await append(key, line)

    async with anyio.create_task_group() as tg:
        tg.start_soon(post, "first:0")
        await anyio.to_thread.run_sync(disk.entered.wait, 10)
        outbox.file.append = counting_append  # type: ignore[method-assign]
        for key in keys:
            tg.start_soon(post, key)
        with anyio.fail_after(10):
            await all_queued.wait()
        disk.release.set()
    return outcomes, early


@pytest.mark.anyio
async def test_concurrent_posts_share_one_write_and_one_fdatasync(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    disk = GatedDisk()
    outbox = OutboxChannel(str(path), disk=disk)
    keys = [f"c{i}:0" for i in range(8)]
    outcomes, early = await _held_then_batched(outbox, disk, keys)
    assert early == []  # nothing was acknowledged before the fdatasync covering it
    assert all(outcomes[k] == ChunkReceipt(delivery_id=k, channel_id="outbox") for k in ["first:0", *keys])
    assert (disk.pwrites, disk.fdatasyncs, outbox.file.batches) == (2, 2, 2)  # 1 + 8 posts
    assert keys_in(path) == ["first:0", *keys]  # one line each, in the order they were posted


@pytest.mark.anyio
async def test_a_failed_fdatasync_fails_its_whole_batch_and_is_never_retried(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    disk = GatedDisk(fail_at=2)
    outbox = OutboxChannel(str(path), disk=disk)
    keys = [f"c{i}:0" for i in range(5)]
    outcomes, _ = await _held_then_batched(outbox, disk, keys)
    assert isinstance(outcomes["first:0"], ChunkReceipt)
    for key in keys:
        error = outcomes[key]
        assert isinstance(error, UnconfirmedDeliveryError) and error.code == "outbox_unsynced"
    assert disk.fdatasyncs == 2
    # The file is failed: a later post, even of the same key, writes and syncs nothing.
    for key in (keys[0], "later:0"):
        with pytest.raises(RetryableDeliveryError):
            await outbox.post(delivery(key))
    assert (disk.pwrites, disk.fdatasyncs) == (2, 2)
    # Reopened (a restart), the file takes posts again; what it holds is read back from disk.
    reopened = OutboxChannel(str(path), disk=OsDisk())
    await reopened.post(delivery("later:0"))
    assert keys_in(path)[0] == "first:0" and keys_in(path)[-1] == "later:0"


@pytest.mark.anyio
async def test_a_key_posted_twice_at_once_is_written_once(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    disk = GatedDisk()
    outbox = OutboxChannel(str(path), disk=disk)
    outcomes, _ = await _held_then_batched(outbox, disk, ["a:0", "b:0", "a:0", "first:0"])
    assert all(isinstance(o, ChunkReceipt) for o in outcomes.values())
    assert keys_in(path) == ["first:0", "a:0", "b:0"]
    assert await outbox.post(delivery("b:0")) == ChunkReceipt(delivery_id="b:0", channel_id="outbox")
    assert disk.fdatasyncs == 2  # the repeat was answered from the index, without a write


@pytest.mark.anyio
async def test_a_failure_before_writing_is_retryable_and_leaves_the_file_usable(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    disk = GatedDisk()
    disk.release.set()
    outbox = OutboxChannel(str(path), disk=disk)
    disk.fail_open = True
    with pytest.raises(RetryableDeliveryError):
        await outbox.post(delivery("a:0"))
    assert (disk.pwrites, disk.fdatasyncs) == (0, 0)
    disk.fail_open = False
    await outbox.post(delivery("a:0"))
    assert keys_in(path) == ["a:0"] and disk.fdatasyncs == 1


@pytest.mark.anyio
async def test_a_cancelled_post_still_queued_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    disk = GatedDisk()
    outbox = OutboxChannel(str(path), disk=disk)
    async with anyio.create_task_group() as tg:
        tg.start_soon(outbox.post, delivery("first:0"))
        await anyio.to_thread.run_sync(disk.entered.wait, 10)
        with anyio.move_on_after(0.1):
            await outbox.post(delivery("gone:0"))  # queued behind the held batch, then cancelled
        disk.release.set()
    await outbox.post(delivery("next:0"))
    assert keys_in(path) == ["first:0", "next:0"]


class ThreadNotingDisk(OsDisk):
    """Notes which thread ran each fdatasync; fails fdatasync number ``fail_at`` with EIO;
    adds ``delay`` seconds to every fdatasync (a slow disk)."""

    def __init__(self, *, fail_at: int | None = None, delay: float = 0.0) -> None:
        self.threads: list[int] = []
        self.fail_at = fail_at
        self.delay = delay

    def fdatasync(self, fd: int) -> None:
        self.threads.append(threading.get_ident())
        if self.delay:
            threading.Event().wait(self.delay)
        if len(self.threads) == self.fail_at:
            raise OSError(errno.EIO, "Input/output error")
        super().fdatasync(fd)


@pytest.mark.anyio
async def test_a_lone_post_is_written_on_the_loop_once_the_disk_is_known_fast(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    disk = ThreadNotingDisk()
    outbox = OutboxChannel(str(path), disk=disk)
    outbox.file.inline_max_s = 60.0  # any real disk is "fast" here: the test is about the path
    for i in range(3):
        await outbox.post(delivery(f"c{i}:0"))
    loop_thread = threading.get_ident()
    # The first write (it may create the file) measures the disk off the loop; then inline.
    assert disk.threads[0] != loop_thread and disk.threads[1:] == [loop_thread, loop_thread]
    assert (outbox.file.batches, outbox.file.inline_batches) == (3, 2)
    assert keys_in(path) == ["c0:0", "c1:0", "c2:0"]


@pytest.mark.anyio
async def test_a_slow_disk_keeps_lone_posts_off_the_loop(tmp_path: Path) -> None:
    disk = ThreadNotingDisk(delay=0.01)
    outbox = OutboxChannel(str(tmp_path / "outbox.jsonl"), disk=disk)
    outbox.file.inline_max_s = 0.001  # below the slow disk's 10 ms, whatever the machine
    for i in range(3):
        await outbox.post(delivery(f"c{i}:0"))
    assert threading.get_ident() not in disk.threads and outbox.file.inline_batches == 0


@pytest.mark.anyio
async def test_a_failed_inline_fdatasync_fails_the_post_and_is_never_retried(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    disk = ThreadNotingDisk(fail_at=2)
    outbox = OutboxChannel(str(path), disk=disk)
    outbox.file.inline_max_s = 60.0
    await outbox.post(delivery("first:0"))
    with pytest.raises(UnconfirmedDeliveryError) as failed:
        await outbox.post(delivery("a:0"))
    assert failed.value.code == "outbox_unsynced"
    assert disk.threads[1] == threading.get_ident() and outbox.file.inline_batches == 1
    # The file is failed: neither the same key nor a new one is written or synced again.
    for key in ("a:0", "b:0"):
        with pytest.raises(RetryableDeliveryError):
            await outbox.post(delivery(key))
    assert len(disk.threads) == 2
    assert keys_in(path)[0] == "first:0" and "b:0" not in keys_in(path)

"""How the group-commit leader gets a batch written (issues 20 and 34): one path.

A lone commit that fits the tail is written inline on the event loop while recent
write+fdatasync time stays under ``inline_commit_max_s``; every other batch in anyio's worker
thread. Either way group commit, durability before return and a failed fdatasync never retried.
"""

from __future__ import annotations

import dataclasses
import errno
import threading
import time

import anyio
import pytest

import afterword.wal as wal_package
from afterword.disk import DiskFailedError, DurabilityError, OsDisk, StateRoot
from afterword.wal import WalOptions, WriteAheadLog, committer
from afterword.wal.testing import inline_by_batch_only

pytestmark = pytest.mark.anyio


class ThreadDisk(OsDisk):
    """Notes which thread ran each fdatasync; can make it slow or fail."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.fail = False
        self.threads: list[str] = []

    def fdatasync(self, fd: int) -> None:
        self.threads.append(threading.current_thread().name)
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            raise OSError(errno.EIO, "injected fdatasync failure")
        super().fdatasync(fd)


def _open(state_dir: str, disk: ThreadDisk, inline_max_s: float = 0.0005) -> WriteAheadLog:
    options = WalOptions(
        segment_size=64 * 1024, max_payload=1024, zero_fill=False, inline_commit_max_s=inline_max_s
    )
    wal, _ = WriteAheadLog.open(StateRoot(state_dir, disk), start_seq=1, checkpoint_lsn=0, options=options)
    return wal


def _frames(state_dir: str) -> list[bytes]:
    wal, frames = WriteAheadLog.open(
        StateRoot(state_dir),
        start_seq=1,
        checkpoint_lsn=0,
        options=WalOptions(segment_size=64 * 1024, max_payload=1024),
    )
    wal.close()
    return [f.payload for f in frames]


async def test_batches_of_several_are_written_off_the_loop_and_grouped(state_dir: str) -> None:
    disk = ThreadDisk()
    wal = _open(state_dir, disk, inline_max_s=1.0)
    await wal.commit(b"first")
    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(wal.commit, b"p%d" % i)
    loop = threading.current_thread().name
    assert loop not in disk.threads[1:]  # batches of several never stall the loop
    assert wal.stats.batches < 21  # followers shared a leader's write
    wal.close()
    assert sorted(_frames(state_dir)[1:]) == sorted(b"p%d" % i for i in range(20))


def _off_loop(name: str) -> bool:
    return name != threading.current_thread().name


async def test_writes_a_lone_commit_inline_while_the_disk_is_fast(state_dir: str) -> None:
    disk = ThreadDisk()
    wal = _open(state_dir, disk, inline_max_s=1.0)  # any real disk is under 1 s
    for i in range(6):
        await wal.commit(b"lone %d" % i)
    # The first write starts the log's first segment life: that one is never inline.
    assert _off_loop(disk.threads[0])
    assert disk.threads[1:] == [threading.current_thread().name] * 5
    wal.close()
    assert _frames(state_dir) == [b"lone %d" % i for i in range(6)]


async def test_never_starts_a_segment_life_on_the_loop(state_dir: str) -> None:
    disk = ThreadDisk()
    options = WalOptions(segment_size=4096, max_payload=1024, zero_fill=False, inline_commit_max_s=1.0)
    wal, _ = WriteAheadLog.open(StateRoot(state_dir, disk), start_seq=1, checkpoint_lsn=0, options=options)
    started = []
    for i in range(12):
        before = len(wal.live_segments(1))
        await wal.commit(bytes([i]) * 700)
        started.append(len(wal.live_segments(1)) > before)
    assert sum(started) > 2  # the small segments filled up several times
    loop = threading.current_thread().name
    assert [_off_loop(t) for t in disk.threads] == started
    assert loop in disk.threads
    wal.close()


async def test_leaves_the_loop_when_the_disk_is_slow(state_dir: str) -> None:
    disk = ThreadDisk()
    wal = _open(state_dir, disk, inline_max_s=0.01)
    await wal.commit(b"first")  # starts the segment life, off the loop
    disk.delay = 0.06
    for i in range(4):
        await wal.commit(b"slow %d" % i)
    # The first lone write ran inline and showed the disk slower than the bound: no more stalls.
    assert disk.threads[1] == threading.current_thread().name
    assert all(_off_loop(t) for t in disk.threads[2:])
    wal.close()


async def test_backs_off_after_an_inline_write_overran_the_bound(
    state_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One write over the bound leaves the running estimate (0.2 x 50 ms) still under it: the
    # back-off alone keeps the next lone commits off the loop.
    monkeypatch.setattr(committer, "INLINE_BACKOFF_S", 60.0)
    disk = ThreadDisk()
    wal = _open(state_dir, disk, inline_max_s=0.02)
    await wal.commit(b"first")  # starts the segment life, off the loop
    disk.delay = 0.05
    await wal.commit(b"overran")
    disk.delay = 0.0
    for i in range(3):
        await wal.commit(b"fast %d" % i)
    assert disk.threads[1] == threading.current_thread().name
    assert all(_off_loop(t) for t in disk.threads[2:])
    assert wal.stats.commits == 5
    wal.close()
    assert _frames(state_dir) == [b"first", b"overran", b"fast 0", b"fast 1", b"fast 2"]


async def test_inline_by_batch_only_pins_the_choice_a_slow_disk_would_change(state_dir: str) -> None:
    """The crash simulator's hook: under it the batch alone decides, so a slow or overrunning
    write (which would send later lone commits off the loop) changes nothing; the write
    itself still runs on the loop, fdatasync included, before the commit returns."""
    disk = ThreadDisk()
    with inline_by_batch_only():
        wal = _open(state_dir, disk, inline_max_s=0.01)
    await wal.commit(b"first")  # starts the segment life, off the loop
    disk.delay = 0.03  # over the bound: without the hook, the loop would be left at once
    for i in range(3):
        await wal.commit(b"slow %d" % i)
    loop = threading.current_thread().name
    assert _off_loop(disk.threads[0]) and disk.threads[1:] == [loop, loop, loop]
    assert wal._committer.inline_overruns == 3  # noted as usual, only not acted on
    wal.close()
    assert _frames(state_dir) == [b"first", b"slow 0", b"slow 1", b"slow 2"]


def test_there_is_one_commit_path_and_no_mode_to_select() -> None:
    """Issue 34: the thread, writer and adaptive modes became the one path above."""
    fields = {f.name for f in dataclasses.fields(WalOptions)}
    assert "commit_mode" not in fields
    assert not hasattr(wal_package, "COMMIT_MODES")
    with pytest.raises(TypeError):
        WalOptions(commit_mode="adaptive")  # type: ignore[call-arg]


async def test_a_zero_bound_writes_every_batch_off_the_loop(state_dir: str) -> None:
    """The bound is the loop's stall budget per commit: 0 spends none of it."""
    disk = ThreadDisk()
    wal = _open(state_dir, disk, inline_max_s=0.0)
    for i in range(4):
        await wal.commit(b"lone %d" % i)
    assert all(_off_loop(t) for t in disk.threads)
    assert wal._committer.inline_batches == 0 and wal.commit_stall_max_s == 0.0
    wal.close()


async def test_the_longest_inline_stall_is_reported(state_dir: str) -> None:
    disk = ThreadDisk()
    wal = _open(state_dir, disk, inline_max_s=1.0)
    await wal.commit(b"first")  # starts the segment life, off the loop
    disk.delay = 0.02
    await wal.commit(b"inline")
    assert 0.02 <= wal.commit_stall_max_s < 1.0
    wal.close()


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="inline_commit_max_s"):
        WalOptions(inline_commit_max_s=-1.0)


@pytest.mark.parametrize("inline_max_s", [0.0, 1.0], ids=["off-loop", "inline"])
async def test_a_failed_fdatasync_fails_the_commit_and_is_never_retried(
    state_dir: str, inline_max_s: float
) -> None:
    disk = ThreadDisk()
    wal = _open(state_dir, disk, inline_max_s)
    await wal.commit(b"durable")
    disk.fail = True
    calls = len(disk.threads)
    with pytest.raises(DurabilityError):
        await wal.commit(b"failed")
    assert len(disk.threads) == calls + 1
    disk.fail = False
    with pytest.raises(DiskFailedError):
        await wal.commit(b"after")  # the root is poisoned: recover by reopening
    assert len(disk.threads) == calls + 1
    wal.close()
    assert _frames(state_dir)[0] == b"durable"

"""How the group-commit leader gets a batch written (issue 20): ``WalOptions.commit_mode``.

``writer``: a dedicated log-writer thread; ``adaptive``: that, plus inline writing of a lone
commit while recent write+fdatasync time stays under the bound; ``thread``: the generic pool.
Each keeps group commit, durability before return and a failed fdatasync never retried.
"""

from __future__ import annotations

import errno
import threading
import time

import anyio
import pytest

from afterword.disk import DiskFailedError, DurabilityError, OsDisk, StateRoot
from afterword.wal import COMMIT_MODES, WalOptions, WriteAheadLog, committer
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


def _open(state_dir: str, disk: ThreadDisk, mode: str, inline_max_s: float = 0.0005) -> WriteAheadLog:
    options = WalOptions(
        segment_size=64 * 1024, max_payload=1024, zero_fill=False, commit_mode=mode, inline_commit_max_s=inline_max_s
    )
    wal, _ = WriteAheadLog.open(StateRoot(state_dir, disk), start_seq=1, checkpoint_lsn=0, options=options)
    return wal


def _frames(state_dir: str) -> list[bytes]:
    wal, frames = WriteAheadLog.open(
        StateRoot(state_dir), start_seq=1, checkpoint_lsn=0, options=WalOptions(segment_size=64 * 1024, max_payload=1024)
    )
    wal.close()
    return [f.payload for f in frames]


async def test_writer_mode_writes_in_its_own_thread_and_groups_commits(state_dir: str) -> None:
    disk = ThreadDisk()
    wal = _open(state_dir, disk, "writer")
    await wal.commit(b"first")
    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(wal.commit, b"p%d" % i)
    assert set(disk.threads) == {"afterword-wal-writer"}
    assert wal.stats.batches < 21  # followers shared a leader's write
    wal.close()
    assert sorted(_frames(state_dir)[1:]) == sorted(b"p%d" % i for i in range(20))


WRITER = "afterword-wal-writer"


async def test_adaptive_mode_writes_a_lone_commit_inline_while_the_disk_is_fast(state_dir: str) -> None:
    disk = ThreadDisk()
    wal = _open(state_dir, disk, "adaptive", inline_max_s=1.0)  # any real disk is under 1 s
    for i in range(6):
        await wal.commit(b"lone %d" % i)
    # The first write starts the log's first segment life: that one is never inline.
    assert disk.threads == [WRITER] + [threading.current_thread().name] * 5
    wal.close()
    assert _frames(state_dir) == [b"lone %d" % i for i in range(6)]


async def test_adaptive_mode_never_starts_a_segment_life_on_the_loop(state_dir: str) -> None:
    disk = ThreadDisk()
    options = WalOptions(
        segment_size=4096, max_payload=1024, zero_fill=False, commit_mode="adaptive", inline_commit_max_s=1.0
    )
    wal, _ = WriteAheadLog.open(StateRoot(state_dir, disk), start_seq=1, checkpoint_lsn=0, options=options)
    started = []
    for i in range(12):
        before = len(wal.live_segments(1))
        await wal.commit(bytes([i]) * 700)
        started.append(len(wal.live_segments(1)) > before)
    assert sum(started) > 2  # the small segments filled up several times
    loop = threading.current_thread().name
    assert disk.threads == [WRITER if new_life else loop for new_life in started]
    wal.close()


async def test_adaptive_mode_leaves_the_loop_when_the_disk_is_slow(state_dir: str) -> None:
    disk = ThreadDisk()
    wal = _open(state_dir, disk, "adaptive", inline_max_s=0.01)
    await wal.commit(b"first")  # starts the segment life, in the writer
    disk.delay = 0.06
    for i in range(4):
        await wal.commit(b"slow %d" % i)
    # The first lone write ran inline and showed the disk slower than the bound: no more stalls.
    assert disk.threads[1] == threading.current_thread().name
    assert set(disk.threads[2:]) == {WRITER}
    wal.close()


async def test_adaptive_mode_backs_off_after_an_inline_write_overran_the_bound(
    state_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One write over the bound leaves the running estimate (0.2 x 50 ms) still under it: the
    # back-off alone keeps the next lone commits off the loop.
    monkeypatch.setattr(committer, "INLINE_BACKOFF_S", 60.0)
    disk = ThreadDisk()
    wal = _open(state_dir, disk, "adaptive", inline_max_s=0.02)
    await wal.commit(b"first")  # starts the segment life, in the writer
    disk.delay = 0.05
    await wal.commit(b"overran")
    disk.delay = 0.0
    for i in range(3):
        await wal.commit(b"fast %d" % i)
    assert disk.threads[1] == threading.current_thread().name
    assert set(disk.threads[2:]) == {WRITER}
    assert wal.stats.commits == 5
    wal.close()
    assert _frames(state_dir) == [b"first", b"overran", b"fast 0", b"fast 1", b"fast 2"]


async def test_inline_by_batch_only_pins_the_choice_a_slow_disk_would_change(state_dir: str) -> None:
    """The crash simulator's hook: under it the batch alone decides, so a slow or overrunning
    write (which would send later lone commits to the writer) changes nothing; the write
    itself still runs on the loop, fdatasync included, before the commit returns."""
    disk = ThreadDisk()
    with inline_by_batch_only():
        wal = _open(state_dir, disk, "adaptive", inline_max_s=0.01)
    await wal.commit(b"first")  # starts the segment life, in the writer
    disk.delay = 0.03  # over the bound: without the hook, the loop would be left at once
    for i in range(3):
        await wal.commit(b"slow %d" % i)
    loop = threading.current_thread().name
    assert disk.threads == [WRITER, loop, loop, loop]
    assert wal._committer.inline_overruns == 3  # noted as usual, only not acted on
    wal.close()
    assert _frames(state_dir) == [b"first", b"slow 0", b"slow 1", b"slow 2"]


def test_the_selectable_commit_modes_are_the_ones_options_accept() -> None:
    for mode in COMMIT_MODES:
        assert WalOptions(commit_mode=mode).commit_mode == mode
    with pytest.raises(ValueError):
        WalOptions(commit_mode="inline")


def test_adaptive_is_the_default_mode() -> None:
    assert WalOptions().commit_mode == "adaptive"


@pytest.mark.parametrize("mode", ["thread", "writer", "adaptive"])
async def test_a_failed_fdatasync_fails_the_commit_and_is_never_retried(state_dir: str, mode: str) -> None:
    disk = ThreadDisk()
    wal = _open(state_dir, disk, mode)
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


def test_close_stops_the_writer_thread(state_dir: str) -> None:
    disk = ThreadDisk()
    wal = _open(state_dir, disk, "writer")
    anyio.run(wal.commit, b"x")
    assert any(t.name == "afterword-wal-writer" for t in threading.enumerate())
    wal.close()
    assert not any(t.name == "afterword-wal-writer" and t.is_alive() for t in threading.enumerate())


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="commit_mode"):
        WalOptions(commit_mode="fast")

"""``WriteAheadLog`` on a real directory: group commit, durability order, segments, repair."""

from __future__ import annotations

import dataclasses
import itertools
import os
import struct
import threading
from pathlib import Path

import anyio
import pytest

from afterword.disk import OsDisk, StateRoot
from afterword.wal import (
    Frame,
    TransactionTooLarge,
    WalClosedError,
    WalCorruptError,
    WalOptions,
    WriteAheadLog,
)
from afterword.wal.layout import (
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    decode_frame_at,
    decode_segment_header,
    frame_size,
)
from afterword.wal.shadow import SHADOW_OVERHEAD

BIG = WalOptions(segment_size=64 * 1024, max_payload=1024, max_log_bytes=1024 * 1024)
# For tests that hold an fdatasync until the loop releases it: that write must run off the
# event loop, so not inline (a zero bound: the default writes a lone commit on a fast disk inline).
HELD = dataclasses.replace(BIG, inline_commit_max_s=0.0)
SMALL = WalOptions(segment_size=4096, max_payload=1024, max_log_bytes=3 * 4096)
_FRAME_HEAD = struct.Struct("<IIQQ")


class RecordingDisk(OsDisk):
    """Records every pwrite and fdatasync in order; can hold fdatasync until released."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int, bytes]] = []  # (op, fd, offset, data)
        self.hold: threading.Event | None = None
        self.entered = threading.Event()

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        super().pwrite(fd, data, offset)
        self.events.append(("pwrite", fd, offset, bytes(data)))

    def fdatasync(self, fd: int) -> None:
        if self.hold is not None:
            self.entered.set()
            self.hold.wait(10)
        super().fdatasync(fd)
        self.events.append(("fdatasync", fd, 0, b""))


def open_wal(
    state_dir: str,
    disk: OsDisk | None = None,
    *,
    start_seq: int = 1,
    checkpoint_lsn: int = 0,
    options: WalOptions = BIG,
) -> tuple[WriteAheadLog, list[Frame]]:
    return WriteAheadLog.open(
        StateRoot(state_dir, disk), start_seq=start_seq, checkpoint_lsn=checkpoint_lsn, options=options
    )


def reopen_frames(
    state_dir: str, *, start_seq: int = 1, checkpoint_lsn: int = 0, options: WalOptions = BIG
) -> list[Frame]:
    wal, frames = open_wal(state_dir, start_seq=start_seq, checkpoint_lsn=checkpoint_lsn, options=options)
    wal.close()
    return frames


def segment_path(state_dir: str, slot: int) -> Path:
    return Path(state_dir) / "wal" / f"{slot:08d}.seg"


def uncovered(events: list[tuple[str, int, int, bytes]], returned: list[tuple[int, int]]) -> list[int]:
    """Lsns whose frame had no later fdatasync of its file before ``commit`` returned.

    ``returned`` holds ``(lsn, number of disk events seen when commit returned)``.
    """
    written: dict[int, tuple[int, int]] = {}
    for index, (op, fd, offset, data) in enumerate(events):
        if op != "pwrite":
            continue
        pos = 0
        if offset == 0:
            if decode_segment_header(data) is None:
                continue  # zero fill of a new segment, or a released header
            pos = SEGMENT_HEADER_SIZE
        while pos + FRAME_HEADER_SIZE <= len(data):
            marker, length, lsn, _ = _FRAME_HEAD.unpack_from(data, pos)
            if marker == 0:
                break
            written[lsn] = (index, fd)
            pos += frame_size(length)
    bad = []
    for lsn, seen in returned:
        index, fd = written[lsn]  # KeyError: the frame never reached a pwrite at all
        if not any(op == "fdatasync" and efd == fd for op, efd, _, _ in events[index + 1 : seen]):
            bad.append(lsn)
    return bad


# -- basics --------------------------------------------------------------------------------------


def test_append_sync_round_trip_and_continue_after_reopen(state_dir: str) -> None:
    wal, frames = open_wal(state_dir)
    assert frames == []
    payloads = [b"t%d" % i * i for i in range(10)]
    assert [wal.append_sync(p) for p in payloads] == list(range(1, 11))
    wal.close()
    wal, frames = open_wal(state_dir)
    assert [(f.lsn, f.payload) for f in frames] == list(enumerate(payloads, 1))
    assert (wal.next_lsn, wal.durable_lsn) == (11, 10)
    assert wal.append_sync(b"more") == 11
    wal.close()
    assert [f.lsn for f in reopen_frames(state_dir)] == list(range(1, 12))


def test_transaction_too_large_is_refused_before_anything_is_written(state_dir: str) -> None:
    wal, _ = open_wal(state_dir)
    with pytest.raises(TransactionTooLarge):
        wal.append_sync(b"x" * (BIG.max_payload + 1))
    with pytest.raises(TransactionTooLarge):
        anyio.run(wal.commit, b"x" * (BIG.max_payload + 1))
    assert (wal.next_lsn, wal.stats.bytes_written) == (1, 0)
    assert wal.append_sync(b"x" * BIG.max_payload) == 1
    wal.close()
    assert [len(f.payload) for f in reopen_frames(state_dir)] == [BIG.max_payload]


def test_closed_log_refuses_commits(state_dir: str) -> None:
    wal, _ = open_wal(state_dir)
    wal.append_sync(b"a")
    wal.close()
    with pytest.raises(WalClosedError):
        wal.append_sync(b"b")
    with pytest.raises(WalClosedError):
        anyio.run(wal.commit, b"b")


# -- group commit ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_group_commit_shares_fdatasyncs(state_dir: str) -> None:
    disk = RecordingDisk()
    wal, _ = open_wal(state_dir, disk)
    got: dict[int, int] = {}

    async def one(i: int) -> None:
        got[i] = await wal.commit(b"c%03d" % i)

    async with anyio.create_task_group() as tg:
        for i in range(48):
            tg.start_soon(one, i)
    assert sorted(got.values()) == list(range(1, 49))
    s = wal.stats
    assert s.commits == 48
    assert 1 <= s.fsyncs < s.commits
    assert s.batches < 48 and s.max_batch > 1
    assert wal.durable_lsn == 48
    wal.close()
    by_lsn = {f.lsn: f.payload for f in reopen_frames(state_dir)}
    assert by_lsn == {lsn: b"c%03d" % i for i, lsn in got.items()}


@pytest.mark.anyio
@pytest.mark.parametrize("fsync", [True, False])
async def test_commit_returns_only_after_an_fdatasync_covering_its_frame(state_dir: str, fsync: bool) -> None:
    """The recorded disk order proves it; without fsync (the unsafe hook) the check must fail."""
    disk = RecordingDisk()
    options = WalOptions(segment_size=4096, max_payload=1024, unsafe_no_fsync=not fsync)
    wal, _ = open_wal(state_dir, disk, options=options)
    returned: list[tuple[int, int]] = []

    async def one(i: int) -> None:
        for _ in range(3):
            lsn = await wal.commit(b"v" * (50 + 37 * i))  # large enough to span segments
            returned.append((lsn, len(disk.events)))

    async with anyio.create_task_group() as tg:
        for i in range(12):
            tg.start_soon(one, i)
    wal.close()
    assert len(returned) == 36
    assert len(list((Path(state_dir) / "wal").glob("*.seg"))) > 1
    bad = uncovered(disk.events, returned)
    if fsync:
        assert bad == []
    else:
        assert sorted(bad) == sorted(lsn for lsn, _ in returned)


@pytest.mark.anyio
async def test_cancelled_leader_does_not_strand_followers(state_dir: str) -> None:
    disk = RecordingDisk()
    wal, _ = open_wal(state_dir, disk, options=HELD)
    disk.hold = threading.Event()
    followers: dict[int, int] = {}
    leader_scope = anyio.CancelScope()

    async def leader() -> None:
        with leader_scope:
            await wal.commit(b"leader")

    async def follower(i: int) -> None:
        followers[i] = await wal.commit(b"follower %d" % i)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(leader)
            await anyio.to_thread.run_sync(disk.entered.wait)  # the leader's write is in flight
            for i in range(8):
                tg.start_soon(follower, i)
            while wal.next_lsn < 10:  # every follower has queued behind the leader
                await anyio.sleep(0)
            leader_scope.cancel()
            await anyio.wait_all_tasks_blocked()  # the cancellation reached the leader mid-write
            disk.hold.set()
    assert sorted(followers.values()) == list(range(2, 10))
    assert wal.durable_lsn == 9
    assert await wal.commit(b"after") == 10
    wal.close()
    frames = reopen_frames(state_dir)  # no hole: the log must not read as corrupt
    assert [f.lsn for f in frames] == list(range(1, 11))
    assert {f.payload for f in frames} >= {b"follower %d" % i for i in range(8)} | {b"after"}


@pytest.mark.anyio
async def test_group_cancelled_together_leaves_nothing_queued(state_dir: str) -> None:
    """A task-group shutdown cancels the leader and its followers at once: the leader still
    drains the queue, so a later synchronous append cannot skip the queued lsns."""
    disk = RecordingDisk()
    wal, _ = open_wal(state_dir, disk, options=HELD)
    disk.hold = threading.Event()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wal.commit, b"leader")
            await anyio.to_thread.run_sync(disk.entered.wait)
            for i in range(3):
                tg.start_soon(wal.commit, b"follower %d" % i)
            while wal.next_lsn < 5:
                await anyio.sleep(0)
            tg.cancel_scope.cancel()
            disk.hold.set()
    assert wal.durable_lsn == wal.next_lsn - 1 == 4
    assert wal.append_sync(b"sync") == 5
    wal.close()
    assert [f.lsn for f in reopen_frames(state_dir)] == [1, 2, 3, 4, 5]


@pytest.mark.anyio
async def test_append_sync_refuses_to_jump_ahead_of_queued_commits(state_dir: str) -> None:
    disk = RecordingDisk()
    wal, _ = open_wal(state_dir, disk, options=HELD)
    disk.hold = threading.Event()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wal.commit, b"in flight")
            await anyio.to_thread.run_sync(disk.entered.wait)
            tg.start_soon(wal.commit, b"queued")
            while wal.next_lsn < 3:
                await anyio.sleep(0)
            with pytest.raises(RuntimeError, match="queued"):
                wal.append_sync(b"would be lsn 3 before lsn 2 is written")
            assert wal.next_lsn == 3
            disk.hold.set()
    assert wal.append_sync(b"now") == 3
    wal.close()
    assert [f.payload for f in reopen_frames(state_dir)] == [b"in flight", b"queued", b"now"]


@pytest.mark.anyio
async def test_commit_of_an_already_cancelled_task_leaves_no_lsn_hole(state_dir: str) -> None:
    wal, _ = open_wal(state_dir)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await wal.commit(b"maybe")  # may or may not be durable, but its lsn must not vanish
    assert await wal.commit(b"surely") == 2
    wal.close()
    frames = reopen_frames(state_dir)
    assert [f.lsn for f in frames] == [1, 2]
    assert frames[-1].payload == b"surely"


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_flush_waits_for_a_leader_in_flight_and_returns(state_dir: str) -> None:
    disk = RecordingDisk()
    wal, _ = open_wal(state_dir, disk, options=HELD)
    await wal.flush()  # nothing queued: immediate
    disk.hold = threading.Event()
    flushed = anyio.Event()

    async def flusher() -> None:
        await wal.flush()
        flushed.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wal.commit, b"in flight")
            await anyio.to_thread.run_sync(disk.entered.wait)
            tg.start_soon(flusher)
            await anyio.wait_all_tasks_blocked()  # flush() ran as far as it can
            assert not flushed.is_set()
            disk.hold.set()
            await flushed.wait()
    assert wal.durable_lsn == 1
    wal.close()


# -- segments --------------------------------------------------------------------------------------


def _headers(state_dir: str) -> dict[int, tuple[int, int]]:
    """slot -> (seq, first_lsn) of every segment file with a valid header."""
    out = {}
    for path in sorted((Path(state_dir) / "wal").glob("*.seg")):
        header = decode_segment_header(path.read_bytes())
        if header is not None:
            out[int(path.stem)] = (header.seq, header.first_lsn)
    return out


def test_segments_switch_when_full(state_dir: str) -> None:
    wal, _ = open_wal(state_dir, options=SMALL)
    payloads = [bytes([i]) * (300 + 23 * i) for i in range(30)]
    for p in payloads:
        wal.append_sync(p)
    headers = _headers(state_dir)
    assert len(headers) > 3
    assert wal.log_bytes == len(headers) * SMALL.segment_size
    assert wal.needs_checkpoint
    wal.close()
    frames = reopen_frames(state_dir, options=SMALL)
    assert [f.payload for f in frames] == payloads
    seqs = sorted(headers.values())
    assert [seq for seq, _ in seqs] == list(range(1, len(seqs) + 1))
    assert seqs[0][1] == 1
    # Each new segment starts with the frame that, with the shadow copy of its write (a
    # write of one frame here), did not fit into the previous one.
    for (_, first), (_, nxt) in itertools.pairwise(seqs):
        size = sum(frame_size(len(payloads[lsn - 1])) for lsn in range(first, nxt))
        last = frame_size(len(payloads[nxt - 1]))
        assert SEGMENT_HEADER_SIZE + size + 2 * last + SHADOW_OVERHEAD > SMALL.segment_size


@pytest.mark.anyio
async def test_one_group_write_spanning_several_segments(state_dir: str) -> None:
    wal, _ = open_wal(state_dir, options=SMALL)
    got: dict[int, int] = {}

    async def one(i: int) -> None:
        got[i] = await wal.commit(bytes([i]) * 900)

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    assert wal.stats.max_batch > 4  # > one segment's worth in a single write
    wal.close()
    frames = reopen_frames(state_dir, options=SMALL)
    assert {f.lsn: f.payload for f in frames} == {lsn: bytes([i]) * 900 for i, lsn in got.items()}


def test_roll_then_reopen_before_the_manifest_moves_keeps_everything(state_dir: str) -> None:
    wal, _ = open_wal(state_dir)
    for i in range(5):
        wal.append_sync(b"a%d" % i)
    assert wal.roll() == (2, 5)
    for i in range(3):
        wal.append_sync(b"b%d" % i)
    wal.close()
    assert _headers(state_dir) == {0: (1, 1), 1: (2, 6)}
    # A crash before the manifest naming (2, 5) is durable: the old chain still replays.
    assert [f.lsn for f in reopen_frames(state_dir)] == list(range(1, 9))
    assert [f.lsn for f in reopen_frames(state_dir, start_seq=2, checkpoint_lsn=5)] == [6, 7, 8]


def test_retire_before_recycles_slots_and_stale_frames_are_ignored(state_dir: str) -> None:
    wal, _ = open_wal(state_dir)
    for i in range(5):
        wal.append_sync(b"old life %d" % i)
    assert wal.roll() == (2, 5)
    wal.append_sync(b"six")
    wal.retire_before(2)
    assert wal.log_bytes == BIG.segment_size
    assert wal.roll() == (3, 6)
    wal.append_sync(b"seven")
    wal.retire_before(3)
    assert wal.log_bytes == BIG.segment_size
    wal.close()
    assert sorted(p.name for p in (Path(state_dir) / "wal").iterdir()) == ["00000000.seg", "00000001.seg"]
    assert _headers(state_dir)[0] == (3, 7)  # slot 0 reused: new seq and salt, old frames behind
    data = segment_path(state_dir, 0).read_bytes()
    assert b"old life 4" in data
    wal, frames = open_wal(state_dir, start_seq=3, checkpoint_lsn=6)
    assert [(f.lsn, f.payload) for f in frames] == [(7, b"seven")]
    assert wal.append_sync(b"eight") == 8
    wal.close()
    assert [f.lsn for f in reopen_frames(state_dir, start_seq=3, checkpoint_lsn=6)] == [7, 8]
    assert not list((Path(state_dir) / "wal").glob("*.broken.*"))


# -- repair and corruption -------------------------------------------------------------------------


def _damage(path: Path, offset: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(data[offset : offset + 1]), offset)
    finally:
        os.close(fd)
    return bytes(data)


def _tear(path: Path, frame: Frame) -> bytes:
    """Damage ``frame`` and the shadow of its write, which sits right behind the last frame
    of a write: what a write that never completed leaves (nothing proves it whole)."""
    _damage(path, frame.offset + FRAME_HEADER_SIZE + 2)
    return _damage(path, frame.end + 8)


def test_torn_tail_is_saved_aside_then_zeroed(state_dir: str) -> None:
    wal, _ = open_wal(state_dir)
    for i in range(5):
        wal.append_sync(b"record %d" % i * 3)
    wal.close()
    frames = reopen_frames(state_dir)
    seg = segment_path(state_dir, 0)
    damaged = _tear(seg, frames[4])

    wal, frames2 = open_wal(state_dir)
    assert [f.lsn for f in frames2] == [1, 2, 3, 4]
    broken = Path(state_dir) / "wal" / "00000000.broken.0"
    assert broken.read_bytes() == damaged
    assert broken.stat().st_mode & 0o777 == 0o600
    after = seg.read_bytes()
    start = frames[4].offset
    assert after[:start] == damaged[:start]
    assert after[start : start + FRAME_HEADER_SIZE] == bytes(FRAME_HEADER_SIZE)
    header = decode_segment_header(after)
    assert header is not None
    assert decode_frame_at(after, start, header.salt, BIG.max_payload) is None

    assert wal.append_sync(b"new five") == 5
    wal.close()
    wal, frames3 = open_wal(state_dir)  # the repair is not repeated
    assert [f.payload for f in frames3][-1] == b"new five"
    assert not (Path(state_dir) / "wal" / "00000000.broken.1").exists()

    _tear(seg, frames3[-1])  # a second tear gets its own copy
    wal.close()
    assert [f.lsn for f in reopen_frames(state_dir)] == [1, 2, 3, 4]
    assert (Path(state_dir) / "wal" / "00000000.broken.1").exists()


@pytest.mark.anyio
async def test_leftovers_of_a_torn_group_write_are_cut_together(state_dir: str) -> None:
    wal, _ = open_wal(state_dir)
    wal.append_sync(b"g0" * 10)  # a write of its own: [1]
    async with anyio.create_task_group() as tg:
        for i in (1, 2):
            tg.start_soon(wal.commit, b"g%d" % i * 10)
    assert wal.stats.batches == 2  # [1] then [2, 3]: frames 2 and 3 share one write
    wal.close()
    frames = reopen_frames(state_dir)
    assert [f.batch_start for f in frames] == [1, 2, 2]
    seg = segment_path(state_dir, 0)
    _damage(seg, frames[1].offset + FRAME_HEADER_SIZE)
    _damage(seg, frames[2].end + 8)  # the write's shadow: it never completed
    assert [f.lsn for f in reopen_frames(state_dir)] == [1]
    after = seg.read_bytes()
    assert after[frames[1].offset : frames[2].end] == bytes(frames[2].end - frames[1].offset)


def test_bad_frame_before_good_ones_fails_closed_and_changes_nothing(state_dir: str) -> None:
    wal, _ = open_wal(state_dir)
    for i in range(5):
        wal.append_sync(b"record %d" % i)
    wal.close()
    frames = reopen_frames(state_dir)
    seg = segment_path(state_dir, 0)
    damaged = _damage(seg, frames[1].offset + FRAME_HEADER_SIZE)
    for _ in range(2):
        with pytest.raises(WalCorruptError):
            open_wal(state_dir)
    assert seg.read_bytes() == damaged
    assert not list((Path(state_dir) / "wal").glob("*.broken.*"))

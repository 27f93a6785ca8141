"""Replay decisions of ``scan_chain`` over synthetic segment bytes: pure, no disk."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afterword.wal import SegmentImage, WalCorruptError, scan_chain
from afterword.wal.layout import (
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    SegmentHeader,
    encode_frame,
    encode_segment_header,
    frame_size,
    marker_for,
)
from afterword.wal.scan import ReplayPlan

SEG = 2048
MAX = 1024
SALT_A = 0x0A0A_0A0A_1111_2223
SALT_B = 0x0B0B_0B0B_3333_4445


@dataclass
class Seg:
    """A segment image under construction: header plus frames appended in order."""

    slot: int
    seq: int
    salt: int
    first_lsn: int
    size: int = SEG
    base: bytes | None = None
    buf: bytearray = field(init=False)
    offsets: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    end: int = SEGMENT_HEADER_SIZE

    def __post_init__(self) -> None:
        self.buf = bytearray(self.base if self.base is not None else bytes(self.size))
        self.buf[:SEGMENT_HEADER_SIZE] = encode_segment_header(
            SegmentHeader(self.seq, self.salt, self.first_lsn)
        )

    def add(self, lsn: int, batch_start: int, payload: bytes | None = None) -> Seg:
        data = encode_frame(self.salt, lsn, batch_start, payload if payload is not None else b"p%d" % lsn)
        self.buf[self.end : self.end + len(data)] = data
        self.offsets.append(self.end)
        self.end += len(data)
        self.ends.append(self.end)
        return self

    def image(self) -> SegmentImage:
        return SegmentImage(self.slot, bytes(self.buf))


def scan(images: list[SegmentImage], *, start_seq: int = 1, checkpoint_lsn: int = 0) -> ReplayPlan:
    return scan_chain(images, start_seq=start_seq, checkpoint_lsn=checkpoint_lsn, max_payload=MAX)


def lsns(plan: ReplayPlan) -> list[int]:
    return [f.lsn for f in plan.frames]


def repaired(images: list[SegmentImage], plan: ReplayPlan) -> list[SegmentImage]:
    """The images after the repair the plan asks for (zero the torn range)."""
    assert plan.repair is not None
    out = []
    for img in images:
        if img.slot == plan.repair.slot:
            data = bytearray(img.data)
            data[plan.repair.start : plan.repair.stop] = bytes(plan.repair.stop - plan.repair.start)
            img = SegmentImage(img.slot, bytes(data))
        out.append(img)
    return out


def assert_repair_is_final(images: list[SegmentImage], plan: ReplayPlan, **kw: int) -> None:
    """Applying the repair keeps the same frames and leaves nothing more to repair."""
    again = scan(repaired(images, plan), **kw)
    assert lsns(again) == lsns(plan)
    assert again.repair is None
    assert (again.tail_slot, again.tail_offset, again.next_lsn) == (
        plan.tail_slot,
        plan.tail_offset,
        plan.next_lsn,
    )


# -- ends of the log -----------------------------------------------------------------------------


def test_empty_pool_continues_after_the_checkpoint() -> None:
    plan = scan([], start_seq=4, checkpoint_lsn=10)
    assert (plan.frames, plan.next_lsn, plan.tail_slot, plan.repair) == ([], 11, None, None)


def test_clean_end_replays_every_frame_and_repairs_nothing() -> None:
    seg = Seg(3, 1, SALT_A, 1).add(1, 1).add(2, 2, b"").add(3, 2, b"x" * 100)
    plan = scan([seg.image()])
    assert lsns(plan) == [1, 2, 3]
    assert [f.payload for f in plan.frames] == [b"p1", b"", b"x" * 100]
    assert (plan.next_lsn, plan.tail_slot, plan.tail_offset) == (4, 3, seg.end)
    assert (plan.repair, plan.free_slots, plan.chain_seqs) == (None, [], [1])
    assert plan.tail_header == SegmentHeader(1, SALT_A, 1)


def test_full_segment_without_end_marker_ends_cleanly() -> None:
    seg = Seg(0, 1, SALT_A, 1, size=SEGMENT_HEADER_SIZE + 2 * frame_size(8))
    seg.add(1, 1, b"8 bytes!").add(2, 2, b"8 bytes!")
    plan = scan([seg.image()])
    assert lsns(plan) == [1, 2]
    assert (plan.tail_offset, plan.repair) == (len(seg.buf), None)


def test_header_only_segment_is_the_tail() -> None:
    plan = scan([Seg(1, 5, SALT_A, 8).image()], start_seq=5, checkpoint_lsn=7)
    assert (plan.frames, plan.next_lsn, plan.tail_slot, plan.tail_offset) == ([], 8, 1, SEGMENT_HEADER_SIZE)


PAYLOAD3 = bytes(range(40, 90))


@pytest.mark.parametrize("kept", range(1, FRAME_HEADER_SIZE + len(PAYLOAD3)))
def test_partial_frame_at_tail(kept: int) -> None:
    """A write torn after ``kept`` bytes of its frame: earlier frames replay, the rest is cut."""
    seg = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2)
    whole = encode_frame(SALT_A, 3, 3, PAYLOAD3)
    seg.buf[seg.end : seg.end + kept] = whole[:kept]
    images = [seg.image()]
    plan = scan(images)
    assert lsns(plan) == [1, 2]
    assert (plan.next_lsn, plan.tail_offset) == (3, seg.end)
    if kept < 4:
        # Not even the marker landed: nothing of this segment life is there to cut.
        assert plan.repair is None
    else:
        assert plan.repair is not None
        assert (plan.repair.slot, plan.repair.start) == (0, seg.end)
        assert seg.end + FRAME_HEADER_SIZE <= plan.repair.stop <= seg.end + len(whole)
        assert_repair_is_final(images, plan)


def test_garbage_over_a_frame_with_intact_header_is_cut() -> None:
    seg = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2).add(3, 3, b"z" * 200)
    rng = random.Random(1)
    tail = seg.offsets[2] + FRAME_HEADER_SIZE + 50
    seg.buf[tail:] = rng.randbytes(len(seg.buf) - tail)
    images = [seg.image()]
    plan = scan(images)
    assert lsns(plan) == [1, 2]
    assert plan.repair is not None and plan.repair.start == seg.offsets[2]
    assert_repair_is_final(images, plan)


def test_garbage_starting_with_our_marker_is_cut() -> None:
    seg = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2)
    rng = random.Random(2)
    garbage = bytearray(rng.randbytes(300))
    garbage[0:4] = marker_for(SALT_A).to_bytes(4, "little")  # a header word that landed, then junk
    seg.buf[seg.end : seg.end + len(garbage)] = garbage
    images = [seg.image()]
    plan = scan(images)
    assert lsns(plan) == [1, 2]
    assert plan.repair is not None and plan.repair.start == seg.end
    assert_repair_is_final(images, plan)


def test_foreign_garbage_after_the_end_is_left_alone() -> None:
    """Bytes that hold no marker of this life cannot be mistaken for frames: no repair needed."""
    seg = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2)
    rng = random.Random(3)
    seg.buf[seg.end :] = rng.randbytes(len(seg.buf) - seg.end)
    assert marker_for(SALT_A).to_bytes(4, "little") not in seg.buf[seg.end :]
    plan = scan([seg.image()])
    assert lsns(plan) == [1, 2]
    assert (plan.repair, plan.tail_offset, plan.next_lsn) == (None, seg.end, 3)


def test_zeroed_tail_is_a_clean_end() -> None:
    seg = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2).add(3, 3)
    seg.buf[seg.offsets[2] :] = bytes(len(seg.buf) - seg.offsets[2])
    plan = scan([seg.image()])
    assert lsns(plan) == [1, 2]
    assert (plan.repair, plan.tail_offset) == (None, seg.offsets[2])


# -- damage followed by frames ---------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["header", "payload", "zeroed"])
def test_bad_frame_followed_by_a_later_write_is_corruption(damage: str) -> None:
    """lsn 3 was written by its own, earlier write; frame 4 proves that write had completed."""
    seg = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2).add(3, 3, b"victim" * 5).add(4, 4)
    off = seg.offsets[2]
    if damage == "header":
        seg.buf[off + 8] ^= 0x01  # the lsn field
    elif damage == "payload":
        seg.buf[off + FRAME_HEADER_SIZE + 3] ^= 0x40
    else:
        seg.buf[off : seg.ends[2]] = bytes(seg.ends[2] - off)
    with pytest.raises(WalCorruptError, match="lsn 4"):
        scan([seg.image()])


@pytest.mark.parametrize(("batch_of_3", "batch_of_4", "damaged"), [(3, 3, 3), (2, 2, 3), (3, 3, 4)])
def test_leftovers_of_the_same_torn_write_are_not_corruption(
    batch_of_3: int, batch_of_4: int, damaged: int
) -> None:
    """Frames whose write began at or before the first missing lsn were never acknowledged."""
    seg = Seg(0, 1, SALT_A, 1).add(1, 1)
    seg.add(2, 2).add(3, batch_of_3).add(4, batch_of_4).add(5, batch_of_4)
    idx = damaged - 1
    seg.buf[seg.offsets[idx] + FRAME_HEADER_SIZE] ^= 0xFF
    images = [seg.image()]
    plan = scan(images)
    assert lsns(plan) == list(range(1, damaged))
    assert plan.repair is not None
    assert (plan.repair.start, plan.repair.stop) == (seg.offsets[idx], seg.ends[-1])
    assert_repair_is_final(images, plan)


def test_one_later_frame_among_leftovers_is_still_corruption() -> None:
    seg = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2).add(3, 2).add(4, 4)
    seg.buf[seg.offsets[1] + FRAME_HEADER_SIZE] ^= 0xFF  # lsn 2 lost; 3 is a leftover, 4 is not
    with pytest.raises(WalCorruptError):
        scan([seg.image()])


def test_duplicate_lsn_where_the_next_is_expected_ends_the_log() -> None:
    seg = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2).add(2, 2)
    plan = scan([seg.image()])
    assert lsns(plan) == [1, 2]
    assert plan.repair is not None and plan.repair.start == seg.offsets[2]


# -- the chain of segments -------------------------------------------------------------------------


def test_chain_continues_across_segments_in_seq_order() -> None:
    a = Seg(5, 3, SALT_A, 11).add(11, 11).add(12, 12).add(13, 12)
    b = Seg(2, 4, SALT_B, 14).add(14, 12).add(15, 15)
    plan = scan([b.image(), a.image()], start_seq=3, checkpoint_lsn=10)
    assert lsns(plan) == [11, 12, 13, 14, 15]
    assert (plan.tail_slot, plan.tail_offset, plan.next_lsn) == (2, b.end, 16)
    assert (plan.chain_seqs, plan.repair, plan.free_slots) == ([3, 4], None, [])


def test_segment_seq_gap_is_corruption() -> None:
    a = Seg(0, 3, SALT_A, 1).add(1, 1)
    c = Seg(1, 5, SALT_B, 2).add(2, 2)
    with pytest.raises(WalCorruptError, match="gap"):
        scan([a.image(), c.image()], start_seq=3)


@pytest.mark.parametrize("first_lsn", [10, 12, 1])
def test_first_segment_must_start_right_after_the_checkpoint(first_lsn: int) -> None:
    seg = Seg(0, 2, SALT_A, first_lsn).add(first_lsn, first_lsn)
    with pytest.raises(WalCorruptError, match="continue at 11"):
        scan([seg.image()], start_seq=2, checkpoint_lsn=10)


def test_segments_below_start_seq_are_retired_and_ignored() -> None:
    old = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2).add(3, 3)
    new = Seg(1, 2, SALT_B, 4).add(4, 4)
    plan = scan([old.image(), new.image()], start_seq=2, checkpoint_lsn=3)
    assert lsns(plan) == [4]
    assert (plan.chain_seqs, plan.free_slots, plan.tail_slot) == ([2], [], 1)


def test_stale_frames_of_an_older_segment_life_after_the_end_are_ignored() -> None:
    old = Seg(0, 1, SALT_A, 1)
    for lsn in range(1, 30):
        old.add(lsn, lsn, b"old life %d" % lsn)
    new = Seg(0, 7, SALT_B, 101, base=bytes(old.buf)).add(101, 101, b"n").add(102, 102, b"n")
    assert new.end < old.end  # old-life frames (with larger batch_starts) follow the end
    plan = scan([new.image()], start_seq=7, checkpoint_lsn=100)
    assert lsns(plan) == [101, 102]
    assert (plan.repair, plan.tail_offset, plan.next_lsn) == (None, new.end, 103)


def test_segment_past_the_end_holding_leftovers_is_freed() -> None:
    """One write spanned two segments and tore in the first: the second is released."""
    a = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2)  # lsn 3 (same write as 4) never landed
    b = Seg(1, 2, SALT_B, 4).add(4, 3).add(5, 3)
    plan = scan([a.image(), b.image()])
    assert lsns(plan) == [1, 2]
    assert (plan.next_lsn, plan.tail_slot, plan.tail_offset) == (3, 0, a.end)
    assert (plan.free_slots, plan.chain_seqs, plan.repair) == ([1], [1], None)


def test_segment_past_the_end_holding_a_later_write_is_corruption() -> None:
    a = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2)
    b = Seg(1, 2, SALT_B, 4).add(4, 4)
    with pytest.raises(WalCorruptError):
        scan([a.image(), b.image()])


def test_tail_repair_then_freed_segment() -> None:
    a = Seg(0, 1, SALT_A, 1).add(1, 1).add(2, 2).add(3, 3)
    a.buf[a.offsets[2] + FRAME_HEADER_SIZE] ^= 1
    b = Seg(1, 2, SALT_B, 4).add(4, 3)
    images = [a.image(), b.image()]
    plan = scan(images)
    assert lsns(plan) == [1, 2]
    assert plan.repair is not None and plan.repair.slot == 0
    assert plan.free_slots == [1]


# -- property: any cut of a well-formed log --------------------------------------------------------


def _layout(
    batches: list[list[int]], first_seq: int, salt: int, slots: list[int], size: int, fill: int
) -> tuple[list[Seg], list[tuple[int, int, int]]]:
    """Lay batches out as ``write_batch`` does; return segments and (lsn, seg index, unpadded end)."""
    segs: list[Seg] = []
    placed: list[tuple[int, int, int]] = []
    lsn = 1
    for batch in batches:
        batch_start = lsn
        for length in batch:
            if not segs or segs[-1].end + frame_size(length) > size:
                index = len(segs)
                segs.append(Seg(slots[index], first_seq + index, salt + 2 * index + 1, lsn, size=size))
            seg = segs[-1]
            seg.add(lsn, batch_start, bytes([fill]) * length)
            placed.append((lsn, len(segs) - 1, seg.offsets[-1] + FRAME_HEADER_SIZE + length))
            lsn += 1
    return segs, placed


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(st.lists(st.integers(0, 200), min_size=1, max_size=4), min_size=1, max_size=10),
    cut_fraction=st.floats(0, 1),
    filler=st.sampled_from(["zeros", "garbage", "old-life"]),
    seed=st.integers(0, 2**32),
)
def test_any_cut_of_a_good_log_recovers_exactly_the_whole_frames(
    batches: list[list[int]], cut_fraction: float, filler: str, seed: int
) -> None:
    """Destroy everything from one byte on (as a crash before the flush would): the scan never
    reports corruption and replays exactly the frames lying wholly before the cut."""
    size = 768
    slots = random.Random(seed).sample(range(20), 20)
    segs, placed = _layout(batches, 10, 0x5EED_0000_0000_0000, slots, size, 0xAB)
    old_segs, _ = _layout([[150] * 3] * 6, 1, 0x01D0_0000_0000_0000, slots, size, 0xCD)
    old = {s.slot: bytes(s.buf) for s in old_segs}
    total = len(segs) * size
    cut = int(cut_fraction * total)
    rng = random.Random(seed)
    images = []
    for index, seg in enumerate(segs):
        local = min(max(cut - index * size, 0), size)
        data = bytearray(seg.buf)
        if filler == "zeros":
            data[local:] = bytes(size - local)
        elif filler == "garbage":
            data[local:] = rng.randbytes(size - local)
        else:
            data[local:] = old.get(seg.slot, bytes(size))[local:]
        images.append(SegmentImage(seg.slot, bytes(data)))
    if filler == "old-life":  # retired segments the new log has not reused yet
        used = {seg.slot for seg in segs}
        images += [SegmentImage(slot, data) for slot, data in old.items() if slot not in used]
    images.sort(key=lambda img: img.slot)
    plan = scan(images, start_seq=10)
    whole = [lsn for lsn, index, end in placed if index * size + end <= cut]
    assert lsns(plan) == whole
    assert plan.next_lsn == len(whole) + 1
    if plan.repair is not None:
        assert_repair_is_final(images, plan, start_seq=10)

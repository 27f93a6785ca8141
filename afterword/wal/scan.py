"""Replay decisions over segment bytes: pure functions, no I/O.

The log is the chain of segments whose header is valid and whose ``seq`` is at least the
manifest's ``wal_start_seq``, in ``seq`` order. Frames must carry contiguous lsns starting at
``checkpoint_lsn + 1``. The log ends at the first position holding no such frame.

After the end, the remaining bytes are searched for frames of the same segment life (same
salt marker). A frame found there whose ``batch_start`` is greater than the first missing lsn
``N`` belongs to a write issued after the write holding ``N`` had been made durable, so the
log lost acknowledged data: :class:`WalCorruptError`. Frames with ``batch_start <= N`` are
leftovers of the torn, unacknowledged write and are cut away by repair.

In a v4 segment, before the end is declared, a valid shadow (``shadow.py``) covering ``N``
proves the write holding ``N`` reached the disk whole: its frames are taken from the copy
and restored, never cut.
"""

from __future__ import annotations

import itertools
import struct
from typing import NamedTuple

from .errors import WalCorruptError, WalEvidenceError
from .layout import (
    ALIGN,
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    Frame,
    SegmentHeader,
    decode_frame_at,
    decode_segment_header,
    find_aligned,
    marker_for,
    read_spans,
)
from .log_frames import LogFrames
from .shadow import Shadow, find_shadow


class SegmentImage(NamedTuple):
    slot: int
    data: bytes  # the whole segment file


class Repair(NamedTuple):
    slot: int
    start: int  # first byte to zero (end of the last whole frame)
    stop: int  # one past the last byte of leftover frames of this segment life


class Restore(NamedTuple):
    """A damaged write whose shadow is whole: rewrite ``data`` at ``offset`` of ``slot``."""

    slot: int
    offset: int
    data: bytes
    first_lsn: int  # first lsn the primary frames could not give
    last_lsn: int


class ReplayPlan(NamedTuple):
    frames: LogFrames  # spans into the segment images: no payload is copied
    next_lsn: int
    tail_slot: int | None  # where writing continues, None when the chain is empty
    tail_offset: int
    tail_header: SegmentHeader | None
    chain_seqs: list[int]
    repair: Repair | None  # torn tail to cut (after saving a .broken copy)
    free_slots: list[int]  # chain segments past the end: leftovers to release
    restores: list[Restore]  # writes to restore from their shadow (before any repair)


def _our_frames_after(data: bytes, start: int, salt: int, max_payload: int) -> tuple[list[Frame], int]:
    """Valid frames of this segment life after ``start``, and the end of the last marker hit."""
    pattern = struct.pack("<I", marker_for(salt))
    found: list[Frame] = []
    last_hit_end = start
    pos = find_aligned(data, pattern, start)
    while pos != -1:
        last_hit_end = max(last_hit_end, pos + FRAME_HEADER_SIZE)
        frame = decode_frame_at(data, pos, salt, max_payload)
        if frame is not None:
            found.append(frame)
            last_hit_end = max(last_hit_end, frame.end)
        pos = find_aligned(data, pattern, pos + 1)
    return found, min(last_hit_end, len(data))


def scan_chain(
    segments: list[SegmentImage], *, start_seq: int, checkpoint_lsn: int, max_payload: int
) -> ReplayPlan:
    """Decide what to replay and what to repair; raise ``WalCorruptError`` on real damage."""
    chain: list[tuple[SegmentHeader, SegmentImage]] = []
    for image in segments:
        header = decode_segment_header(image.data)
        if header is not None and header.seq >= start_seq:
            chain.append((header, image))
    chain.sort(key=lambda item: item[0].seq)
    for (prev, _), (cur, _) in itertools.pairwise(chain):
        if cur.seq != prev.seq + 1:
            raise WalCorruptError(f"segment seq gap: {prev.seq} then {cur.seq}")

    expect = checkpoint_lsn + 1
    frames = LogFrames(expect)
    tail_slot: int | None = None
    tail_offset = SEGMENT_HEADER_SIZE
    tail_header: SegmentHeader | None = None
    repair: Repair | None = None
    free_slots: list[int] = []
    restores: list[Restore] = []
    ended = False

    for index, (header, image) in enumerate(chain):
        if index == 0 and header.first_lsn != expect:
            raise WalCorruptError(
                f"segment slot {image.slot} starts at lsn {header.first_lsn}, "
                f"but the log must continue at {expect}"
            )
        if ended or header.first_lsn != expect:
            # Past the end of the log: only leftovers of the torn write may live here.
            ended = True
            leftovers, _ = _our_frames_after(image.data, SEGMENT_HEADER_SIZE, header.salt, max_payload)
            _check_leftovers(leftovers, expect, image.slot)
            free_slots.append(image.slot)
            continue
        data = image.data
        offset = SEGMENT_HEADER_SIZE
        frames.start_run(data)
        seg_first = len(frames)
        while True:
            offset, expect = read_spans(data, offset, header.salt, expect, max_payload, frames.spans)
            assert offset % ALIGN == 0 and offset >= SEGMENT_HEADER_SIZE, "frames start on the grid"
            if header.version < 4:
                break
            shadow = find_shadow(data, header.salt, offset, expect)
            restored = _from_shadow(shadow, frames, seg_first, expect, offset, header.salt, max_payload)
            if shadow is None or restored is None:
                break
            restores.append(Restore(image.slot, shadow.start, shadow.copy, expect, shadow.last_lsn))
            frames.start_run(shadow.copy, shadow.start)
            frames.spans.extend(restored)
            frames.start_run(data)
            expect = shadow.last_lsn + 1
            offset = shadow.offset
        tail_slot, tail_offset, tail_header = image.slot, offset, header
        leftovers, hit_end = _our_frames_after(data, offset, header.salt, max_payload)
        if leftovers or hit_end > offset:
            _check_leftovers(leftovers, expect, image.slot)
            assert offset <= hit_end <= len(data), "the cut lies inside the segment, after the log"
            repair = Repair(image.slot, offset, hit_end)
            ended = True
    live = [h.seq for h, img in chain if img.slot not in free_slots]
    # Lsns are contiguous from the checkpoint: frame i has lsn checkpoint_lsn + 1 + i.
    assert frames.first_lsn == checkpoint_lsn + 1 and expect == frames.first_lsn + len(frames)
    assert tail_slot is None or tail_slot not in free_slots, "writing continues in the live chain"
    return ReplayPlan(
        frames=frames,
        next_lsn=expect,
        tail_slot=tail_slot,
        tail_offset=tail_offset,
        tail_header=tail_header,
        chain_seqs=live,
        repair=repair,
        free_slots=free_slots,
        restores=restores,
    )


def _from_shadow(
    shadow: Shadow | None,
    frames: LogFrames,
    seg_first: int,
    expect: int,
    offset: int,
    salt: int,
    max_payload: int,
) -> list[int] | None:
    """The payload spans (start, end, ... in ``shadow.copy``) of the frames from ``expect``
    on that ``shadow`` restores, or None if it does not fit here.

    The shadow must cover a write that starts where this segment has it: at ``offset`` when
    the write's first lsn is ``expect``, else at the offset of the frame already read with
    that lsn (the write's undamaged beginning).
    """
    if shadow is None:
        return None
    if shadow.first_lsn == expect:
        if shadow.start != offset:
            return None
    else:
        index = len(frames) - (expect - shadow.first_lsn)
        if index < seg_first or frames.frame(index).offset != shadow.start:
            return None
    out: list[int] = []
    pos, lsn = 0, shadow.first_lsn
    while pos < len(shadow.copy):
        frame = decode_frame_at(shadow.copy, pos, salt, max_payload)
        if frame is None or frame.lsn != lsn:
            return None
        if lsn >= expect:
            out += (pos + FRAME_HEADER_SIZE, pos + FRAME_HEADER_SIZE + len(frame.payload))
        pos, lsn = frame.end, lsn + 1
    return out if lsn == shadow.last_lsn + 1 and pos == len(shadow.copy) else None


def _check_leftovers(leftovers: list[Frame], first_missing: int, slot: int) -> None:
    for frame in leftovers:
        if frame.batch_start > first_missing:
            raise WalCorruptError(
                f"segment slot {slot}: frame lsn {frame.lsn} (write starting at "
                f"{frame.batch_start}) survives after missing lsn {first_missing}; "
                "a durable write was lost"
            )


class NamedSegment(NamedTuple):
    """A segment life a MANIFEST names (``slot``, ``seq``, ``salt``, ``first_lsn``)."""

    slot: int
    seq: int
    salt: int
    first_lsn: int
    size: int


def check_named(
    named: list[NamedSegment],
    images: list[SegmentImage],
    *,
    start_seq: int,
    wal_path: str,
) -> None:
    """Every segment life the MANIFEST names must still be there, whole and unchanged.

    A named life's header was durable before the MANIFEST named it, so no crash can remove
    it: a missing, short, zeroed or reused slot is damage (``WalEvidenceError``).
    """
    by_slot = {img.slot: img for img in images}
    for ref in named:
        if ref.seq < start_seq:
            continue
        path = f"{wal_path}/{ref.slot:08d}.seg"
        image = by_slot.get(ref.slot)
        if image is None:
            raise WalEvidenceError(path, "segment_missing", f"MANIFEST names segment seq {ref.seq}")
        if len(image.data) != ref.size:
            raise WalEvidenceError(
                path, "segment_short", f"{len(image.data)} bytes, the segment had {ref.size}"
            )
        header = decode_segment_header(image.data)
        if header is None or (header.seq, header.salt, header.first_lsn) != (
            ref.seq,
            ref.salt,
            ref.first_lsn,
        ):
            raise WalEvidenceError(
                path, "segment_replaced", f"header is not segment seq {ref.seq} named by MANIFEST"
            )


def check_acked(next_lsn: int, acked_lsn: int, wal_path: str) -> None:
    """Replay must reach every lsn the MANIFEST recorded as acknowledged."""
    if next_lsn - 1 < acked_lsn:
        raise WalEvidenceError(
            wal_path,
            "acknowledged_lost",
            f"the log ends at lsn {next_lsn - 1} but lsn {acked_lsn} was acknowledged",
        )

"""The replay scan's frame loop (``frame.read_spans``) against the plainest reading of the
format: ``decode_frame_at`` frame after frame, on valid, torn, bit-flipped, zeroed and
shadow-bearing segments; and ``find_aligned`` against a search of every grid offset.
(The C versions of both were removed: replay has one path, in Python.)"""

from __future__ import annotations

from array import array

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from afterword.wal.layout import (
    ALIGN,
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    SegmentHeader,
    decode_frame_at,
    encode_frame,
    encode_segment_header,
    find_aligned,
    read_spans,
)
from afterword.wal.shadow import encode_shadow

SEG = 4096


@st.composite
def segments(draw: st.DrawFn) -> tuple[bytes, int, list[int]]:
    """A segment image (header, batches of frames, the last batch's shadow), then damaged
    (torn, bit-flipped, zeroed) or not; returns it, its salt and its frames' offsets."""
    salt = draw(st.integers(min_value=0, max_value=2**64 - 1))
    first = draw(st.integers(min_value=1, max_value=2**40))
    buf = bytearray(SEG)
    buf[:SEGMENT_HEADER_SIZE] = encode_segment_header(SegmentHeader(1, salt, first))
    pos, lsn, offsets = SEGMENT_HEADER_SIZE, first, []
    batches = draw(st.lists(st.lists(st.binary(max_size=120), min_size=1, max_size=4), max_size=6))
    for n, batch in enumerate(batches):
        start, frames, batch_start = pos, b"", lsn
        for payload in batch:
            offsets.append(start + len(frames))
            frames += encode_frame(salt, lsn, batch_start, payload)
            lsn += 1
        parts = [frames]
        if n == len(batches) - 1 and draw(st.booleans()):
            parts += encode_shadow(salt, start, lsn - len(batch), lsn - 1, frames)
        data = b"".join(parts)
        if start + len(data) > SEG:
            break
        buf[start : start + len(data)] = data
        pos = start + len(frames)
    damage = draw(st.sampled_from(["none", "flip", "tear", "zero"]))
    if damage == "flip":
        at = draw(st.integers(min_value=SEGMENT_HEADER_SIZE, max_value=SEG - 1))
        buf[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
    elif damage == "tear":
        buf = buf[: draw(st.integers(min_value=SEGMENT_HEADER_SIZE, max_value=SEG))]
    elif damage == "zero":
        at = draw(st.integers(min_value=SEGMENT_HEADER_SIZE, max_value=SEG - 1))
        end = at + draw(st.integers(min_value=1, max_value=64))
        buf[at:end] = bytes(len(buf[at:end]))
    return bytes(buf), salt, offsets


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seg=segments(),
    start_at=st.integers(min_value=0, max_value=30),
    lsn_shift=st.sampled_from([0, 0, 0, 1, -1]),
    max_payload=st.sampled_from([1024, 1024, 60, 0]),
)
def test_read_spans_reads_exactly_the_frames_decode_frame_at_accepts(
    seg: tuple[bytes, int, list[int]], start_at: int, lsn_shift: int, max_payload: int
) -> None:
    data, salt, offsets = seg
    header_first = int.from_bytes(data[24:32], "little")
    offset, expect = SEGMENT_HEADER_SIZE, header_first
    if offsets and start_at:
        k = start_at % len(offsets)
        offset, expect = offsets[k], header_first + k
    expect = max(0, expect + lsn_shift)
    spans: array[int] = array("q")
    end = read_spans(data, offset, salt, expect, max_payload, spans)

    # The reference: one decode_frame_at per frame, while each is whole and next in line.
    want: list[int] = []
    pos, lsn = offset, expect
    while (frame := decode_frame_at(data, pos, salt, max_payload)) is not None and frame.lsn == lsn:
        want += (pos + FRAME_HEADER_SIZE, pos + FRAME_HEADER_SIZE + len(frame.payload))
        pos, lsn = frame.end, lsn + 1
    assert end == (pos, lsn)
    assert spans.tolist() == want


@settings(max_examples=300, deadline=None)
@given(
    pattern=st.sampled_from([b"LAWSHDW\x01", b"\x01\x02\x03\x04", b"\x00\x00\x00\x00", b"ab"]),
    size=st.integers(min_value=0, max_value=300),
    at=st.lists(st.integers(min_value=0, max_value=300), max_size=5),
    start=st.integers(min_value=0, max_value=320),
    filler=st.sampled_from([b"\x00", b"\x01", b"L"]),
)
def test_find_aligned_finds_the_first_grid_offset_holding_the_pattern(
    pattern: bytes, size: int, at: list[int], start: int, filler: bytes
) -> None:
    buf = bytearray(filler * size)
    for pos in at:
        buf[pos : pos + len(pattern)] = pattern
    data = bytes(buf)
    grid = range((start + ALIGN - 1) // ALIGN * ALIGN, len(data) - len(pattern) + 1, ALIGN)
    want = next((p for p in grid if data[p : p + len(pattern)] == pattern), -1)
    assert find_aligned(data, pattern, start) == want

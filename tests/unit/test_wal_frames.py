"""``LogFrames``: the frames replay hands over as spans into the segment images.

The store decodes payloads straight from those spans; everything else reads frames as a
sequence of ``Frame``. Both views must agree with the bytes on disk, across several buffers
(segments, and a shadow's copy for a restored write, whose offsets are the segment's)."""

from __future__ import annotations

import pytest

from afterword.wal.layout import FRAME_HEADER_SIZE, SEGMENT_HEADER_SIZE, Frame, decode_frame_at, encode_frame
from afterword.wal.log_frames import LogFrames

SALT = 0x0BAD_CAFE_1234_5679


def _segment(first_lsn: int, payloads: list[bytes]) -> tuple[bytes, list[int]]:
    """Frames from ``first_lsn`` after a (blank) segment header, and their offsets."""
    data, offsets = bytearray(SEGMENT_HEADER_SIZE), []
    for i, payload in enumerate(payloads):
        offsets.append(len(data))
        data += encode_frame(SALT, first_lsn + i, first_lsn, payload)
    return bytes(data), offsets


def _add(frames: LogFrames, data: bytes, offsets: list[int], shift: int = 0) -> None:
    frames.start_run(data, shift)
    for at in offsets:
        length = int.from_bytes(data[at + 4 : at + 8], "little")
        frames.spans.extend((at + FRAME_HEADER_SIZE, at + FRAME_HEADER_SIZE + length))


def test_frames_read_from_several_buffers_match_the_bytes() -> None:
    one, at_one = _segment(5, [b"a", b"", b"ccc" * 50])
    two, at_two = _segment(8, [b"dd", b"e" * 9])
    frames = LogFrames(5)
    frames.start_run(b"never used")  # a run that gets no frame is dropped
    _add(frames, one, at_one)
    copy = two[SEGMENT_HEADER_SIZE:]  # as restored from a shadow: the copy, shifted
    _add(frames, copy, [at - SEGMENT_HEADER_SIZE for at in at_two], shift=SEGMENT_HEADER_SIZE)

    expected = [decode_frame_at(one, at, SALT, 1 << 20) for at in at_one]
    expected += [decode_frame_at(two, at, SALT, 1 << 20) for at in at_two]
    assert len(frames) == 5 and len(frames.runs) == 2
    assert list(frames) == expected  # offsets, lsns, batch starts, payloads, ends
    assert frames == expected and frames[-1] == expected[-1] and frames[1:3] == expected[1:3]
    assert [bytes(frames.payload(i)) for i in range(5)] == [f.payload for f in expected if f]
    assert [(lsn, bytes(p)) for lsn, p in frames.payloads()] == [(f.lsn, f.payload) for f in expected if f]
    owners = frames.owners()
    assert [bytes(owners[i][frames.spans[2 * i] : frames.spans[2 * i + 1]]) for i in range(5)] == [
        f.payload for f in expected if f
    ]
    with pytest.raises(IndexError):
        frames[5]
    assert frames != [expected[0]]


def test_from_frames_keeps_lsns_payloads_and_batch_starts() -> None:
    given = [Frame(0, 3, 3, b"x", 0), Frame(0, 4, 3, b"", 0), Frame(0, 5, 5, b"z" * 20, 0)]
    frames = LogFrames.from_frames(given)
    assert [(f.lsn, f.batch_start, f.payload) for f in frames] == [
        (3, 3, b"x"),
        (4, 3, b""),
        (5, 5, b"z" * 20),
    ]
    assert len(LogFrames.from_frames([])) == 0
    with pytest.raises(ValueError, match="contiguous"):
        LogFrames.from_frames([given[0], given[2]])

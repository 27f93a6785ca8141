"""Frame and segment-header byte layout (afterword/wal/layout.py): pure, no disk."""

from __future__ import annotations

import struct

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from afterword.wal.layout import (
    ALIGN,
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    SegmentHeader,
    decode_frame_at,
    decode_segment_header,
    encode_frame,
    encode_segment_header,
    frame_size,
    is_end_marker,
    marker_for,
    padded,
)

SALT = 0x1234_5678_9ABC_DEF1
MAX = 1 << 20


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 15, 16, 17, 255, 1000])
def test_frame_round_trip_and_alignment(length: int) -> None:
    payload = bytes((i * 7 + 3) & 0xFF for i in range(length))
    data = encode_frame(SALT, 42, 40, payload)
    assert len(data) == frame_size(length) == FRAME_HEADER_SIZE + padded(length)
    assert len(data) % ALIGN == 0
    assert data[FRAME_HEADER_SIZE + length :] == b"\x00" * (padded(length) - length)
    frame = decode_frame_at(data, 0, SALT, MAX)
    assert frame is not None
    assert (frame.offset, frame.lsn, frame.batch_start, frame.payload, frame.end) == (
        0,
        42,
        40,
        payload,
        len(data),
    )


@given(
    st.lists(st.binary(max_size=64), min_size=1, max_size=6),
    st.integers(min_value=1, max_value=2**64 - 1),
    st.integers(min_value=0, max_value=3),
)
def test_frames_decode_back_to_back_at_any_aligned_offset(
    payloads: list[bytes], salt: int, lead_words: int
) -> None:
    """Consecutive frames chain through ``end``; a frame may start at any 8-aligned offset."""
    data = b"\x00" * (lead_words * ALIGN) + b"".join(
        encode_frame(salt, 10 + i, 10, p) for i, p in enumerate(payloads)
    )
    offset = lead_words * ALIGN
    for i, payload in enumerate(payloads):
        frame = decode_frame_at(data, offset, salt, MAX)
        assert frame is not None
        assert (frame.lsn, frame.payload, frame.offset) == (10 + i, payload, offset)
        offset = frame.end
    assert offset == len(data)


def test_every_header_or_payload_byte_flip_is_rejected() -> None:
    payload = b"after-image: the whole record, not a diff!"
    data = encode_frame(SALT, 7, 5, payload)
    covered = FRAME_HEADER_SIZE + len(payload)  # padding is deliberately not covered
    for index in range(covered):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[index] ^= mask
            assert decode_frame_at(bytes(damaged), 0, SALT, MAX) is None, (index, mask)


def test_wrong_salt_is_rejected_even_with_the_same_marker() -> None:
    data = encode_frame(SALT, 1, 1, b"payload")
    assert decode_frame_at(data, 0, SALT ^ (1 << 40), MAX) is None  # same low 32 bits: checksum seed
    assert marker_for(SALT ^ (1 << 40)) == marker_for(SALT)
    assert decode_frame_at(data, 0, SALT ^ 0x10, MAX) is None  # other marker
    assert decode_frame_at(data, 0, SALT, MAX) is not None


def test_marker_is_never_zero() -> None:
    """Zero means "end of log", so a salt whose low word is zero still gets a non-zero marker."""
    salt = 0xABCD_0000_0000_0000
    assert marker_for(salt) == 1
    data = encode_frame(salt, 1, 1, b"")
    assert not is_end_marker(data, 0)
    frame = decode_frame_at(data, 0, salt, MAX)
    assert frame is not None and frame.payload == b""


def test_truncated_frame_is_not_decoded() -> None:
    payload = b"x" * 40
    data = encode_frame(SALT, 3, 3, payload)
    for cut in range(FRAME_HEADER_SIZE + len(payload)):
        assert decode_frame_at(data[:cut], 0, SALT, MAX) is None, cut
    # Padding carries no information: a frame whose padding was not written is still whole.
    assert decode_frame_at(data[: FRAME_HEADER_SIZE + len(payload)], 0, SALT, MAX) is not None


def test_length_above_max_payload_is_rejected_before_reading() -> None:
    data = encode_frame(SALT, 1, 1, b"y" * 100)
    assert decode_frame_at(data, 0, SALT, 100) is not None
    assert decode_frame_at(data, 0, SALT, 99) is None


def test_end_marker() -> None:
    data = b"\x00" * 16 + encode_frame(SALT, 1, 1, b"z")
    assert is_end_marker(data, 0)
    assert is_end_marker(data, 8)
    assert not is_end_marker(data, 16)
    assert is_end_marker(data, len(data))  # past the end of the segment
    assert is_end_marker(data, len(data) - 4)  # not even a whole word left


def test_segment_header_round_trip() -> None:
    header = SegmentHeader(seq=9, salt=SALT, first_lsn=1234)
    data = encode_segment_header(header)
    assert len(data) == SEGMENT_HEADER_SIZE
    assert data.startswith(SEGMENT_MAGIC)
    assert decode_segment_header(data) == header
    assert decode_segment_header(data + b"frames follow") == header


def test_torn_or_damaged_segment_header_is_none() -> None:
    data = encode_segment_header(SegmentHeader(seq=2, salt=SALT, first_lsn=17))
    for cut in range(SEGMENT_HEADER_SIZE):
        torn = data[:cut] + b"\x00" * (SEGMENT_HEADER_SIZE - cut)
        assert decode_segment_header(torn) is None, cut
        assert decode_segment_header(data[:cut]) is None, cut
    for index in range(SEGMENT_HEADER_SIZE):
        damaged = bytearray(data)
        damaged[index] ^= 0x04
        assert decode_segment_header(bytes(damaged)) is None, index
    assert decode_segment_header(b"\x00" * SEGMENT_HEADER_SIZE) is None


def test_foreign_magic_with_valid_checksum_is_none() -> None:
    body = struct.pack("<8sQQQ24x", b"AWWAL\x02\x00\x00", 1, SALT, 1)
    data = body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    assert decode_segment_header(data) is None

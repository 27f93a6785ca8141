"""Byte layout of WAL segments and frames: pure functions, no I/O.

Segment header (64 bytes, little endian)::

    0   8  magic  b"AWWAL\\x04\\x00\\x00" (v4: batches carry a shadow, see ``shadow.py``;
                  b"AWWAL\\x03\\x00\\x00" segments, written before shadows, still replay)
    8   8  seq          segment sequence number (monotonic across the pool)
    16  8  salt         random per segment life; seeds every frame checksum
    24  8  first_lsn    lsn of the first frame this segment life holds
    32  24 reserved     zero
    56  8  xxh3-64 of bytes 0..56

Frame (32-byte header + payload padded to 8 bytes)::

    0   4  marker       low 32 bits of salt, forced non-zero (0 means "end of log")
    4   4  length       payload length in bytes
    8   8  lsn          transaction number, contiguous across the log
    16  8  batch_start  lsn of the first frame of the write this frame was part of
    24  8  checksum     xxh3-64(header[0:24] + payload, seed=salt)

The marker and length share one aligned 8-byte word, so a length is never torn.
"""

from __future__ import annotations

import struct
from array import array
from typing import NamedTuple

import xxhash

SEGMENT_MAGIC_V3 = b"AWWAL\x03\x00\x00"
SEGMENT_MAGIC = b"AWWAL\x04\x00\x00"
SEGMENT_VERSIONS = {SEGMENT_MAGIC_V3: 3, SEGMENT_MAGIC: 4}
SEGMENT_HEADER_SIZE = 64
FRAME_HEADER_SIZE = 32
ALIGN = 8

_SEG = struct.Struct("<8sQQQ24x")
_FRAME = struct.Struct("<IIQQ")
_FRAME_WITH_CHECK = struct.Struct("<IIQQQ")
_U64 = struct.Struct("<Q")


class SegmentHeader(NamedTuple):
    seq: int
    salt: int
    first_lsn: int
    version: int = 4  # 3: written before batches carried shadows (no restore possible)


class Frame(NamedTuple):
    offset: int
    lsn: int
    batch_start: int
    payload: bytes
    end: int  # offset just past the padded frame


def padded(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def frame_size(payload_len: int) -> int:
    return FRAME_HEADER_SIZE + padded(payload_len)


def marker_for(salt: int) -> int:
    return (salt & 0xFFFFFFFF) or 1


def encode_segment_header(header: SegmentHeader) -> bytes:
    magic = SEGMENT_MAGIC if header.version == 4 else SEGMENT_MAGIC_V3
    body = _SEG.pack(magic, header.seq, header.salt, header.first_lsn)
    return body + _U64.pack(xxhash.xxh3_64_intdigest(body))


def decode_segment_header(data: bytes) -> SegmentHeader | None:
    """The header, or None when absent/torn/foreign (the slot then counts as free)."""
    if len(data) < SEGMENT_HEADER_SIZE:
        return None
    body = bytes(data[:56])
    (check,) = _U64.unpack_from(data, 56)
    if xxhash.xxh3_64_intdigest(body) != check:
        return None
    magic, seq, salt, first_lsn = _SEG.unpack(body)
    version = SEGMENT_VERSIONS.get(magic)
    if version is None:
        return None
    return SegmentHeader(seq, salt, first_lsn, version)


def encode_frame(salt: int, lsn: int, batch_start: int, payload: bytes) -> bytes:
    head = _FRAME.pack(marker_for(salt), len(payload), lsn, batch_start)
    h = xxhash.xxh3_64(head, seed=salt)
    h.update(payload)
    pad = padded(len(payload)) - len(payload)
    return b"".join((head, _U64.pack(h.intdigest()), payload, b"\x00" * pad))


def decode_frame_at(data: bytes | memoryview, offset: int, salt: int, max_payload: int) -> Frame | None:
    """The frame at ``offset`` if it is whole and its checksum matches, else None."""
    if offset + FRAME_HEADER_SIZE > len(data):
        return None
    marker, length, lsn, batch_start = _FRAME.unpack_from(data, offset)
    if marker != marker_for(salt) or length > max_payload:
        return None
    start = offset + FRAME_HEADER_SIZE
    end = start + length
    if end > len(data):
        return None
    (check,) = _U64.unpack_from(data, offset + 24)
    h = xxhash.xxh3_64(data[offset : offset + 24], seed=salt)
    payload = bytes(data[start:end])
    h.update(payload)
    if h.intdigest() != check:
        return None
    return Frame(offset, lsn, batch_start, payload, offset + frame_size(length))


def find_aligned(data: bytes, pattern: bytes, start: int) -> int:
    """The first offset at or after ``start`` on the 8-byte grid where ``data`` holds
    ``pattern``, or -1: only grid offsets can start a frame or a shadow."""
    pos = data.find(pattern, start)
    while pos != -1 and pos % ALIGN:
        pos = data.find(pattern, pos + 1)
    return pos


def is_end_marker(data: bytes | memoryview, offset: int) -> bool:
    """A zero word where a frame would start: the clean end of a preallocated segment."""
    if offset + ALIGN > len(data):
        return True
    return bool(_U64.unpack_from(data, offset)[0] == 0)


def read_spans(
    data: bytes, offset: int, salt: int, expect: int, max_payload: int, spans: array[int]
) -> tuple[int, int]:
    """Append to ``spans`` the payload span ``(start, end)`` in ``data`` of each frame at
    ``offset`` on whose lsns continue from ``expect``; return where the run stopped and the
    next expected lsn. Nothing is copied out of ``data`` and no object is made per frame:
    one ``unpack_from`` per frame, hashing straight from a memoryview of the segment with one
    reused hasher. Stops exactly where :func:`decode_frame_at` would reject the frame or its
    lsn is not the expected one (``tests/unit/test_wal_read_spans.py``).
    """
    view = memoryview(data)
    unpack = _FRAME_WITH_CHECK.unpack_from
    marker = marker_for(salt)
    size = len(data)
    hasher = xxhash.xxh3_64(seed=salt)
    reset, update, digest = hasher.reset, hasher.update, hasher.intdigest
    append = spans.append
    while offset + FRAME_HEADER_SIZE <= size:
        found, length, lsn, _batch_start, check = unpack(data, offset)
        start = offset + FRAME_HEADER_SIZE
        end = start + length
        if found != marker or lsn != expect or length > max_payload or end > size:
            break
        reset()
        update(view[offset : offset + 24])
        update(view[start:end])
        if digest() != check:
            break
        append(start)
        append(end)
        offset = start + ((length + ALIGN - 1) & ~(ALIGN - 1))
        expect += 1
    return offset, expect

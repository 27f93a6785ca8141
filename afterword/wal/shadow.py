"""Batch shadows: a self-checking copy of a group-commit write, right behind its frames.

Without it, damage to the last write of a log (a flipped bit after ``kill -9``) looks exactly
like a torn write, and replay would cut a transaction that may have been acknowledged. With
it, every write of a v4 segment is ``frames + shadow`` in the same ``pwrite`` and
``fdatasync``; the next write starts where the shadow starts, so only the last write's shadow
survives and the space cost is one batch. Replay reads the two cases apart:

* a valid shadow covers the first lsn replay cannot read: the whole write reached the disk
  (its ``fdatasync`` may or may not have returned; applying it is right either way), so the
  frames are restored from the copy;
* no valid shadow: the write never completed, so it was never acknowledged, and cutting it
  is allowed.

Layout (little endian, starts on the 8-byte grid right after the write's last frame)::

    0   8  magic        b"LAWSHDW\\x01" (first byte even: never a frame marker, those are odd)
    8   8  start        segment offset of the first frame the shadow covers
    16  8  length       bytes of frames covered (= bytes of the copy)
    24  8  first_lsn
    32  8  last_lsn
    40  8  xxh3-64(copy, seed=salt)
    48  8  xxh3-64(bytes 0..48, seed=salt)
    56  4  zero         puts the copy 4 bytes off the grid, so the frames inside it never
                        look like frames to the scan for leftovers (which looks on the grid)
    60  .. copy         the frames, byte for byte
    ..  4  zero         the shadow ends on the grid
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import xxhash

from .layout import find_aligned

SHADOW_MAGIC = b"LAWSHDW\x01"
SHADOW_HEADER_SIZE = 60
SHADOW_OVERHEAD = SHADOW_HEADER_SIZE + 4  # bytes a shadow takes besides its copy
ALIGN = 8

_HEAD = struct.Struct("<8sQQQQQ")
_U64 = struct.Struct("<Q")
_PAD = b"\x00" * 4


class Shadow(NamedTuple):
    offset: int  # where the shadow itself starts
    start: int
    first_lsn: int
    last_lsn: int
    copy: bytes


def shadow_size(frames_len: int) -> int:
    return SHADOW_OVERHEAD + frames_len


def encode_shadow(salt: int, start: int, first_lsn: int, last_lsn: int, frames: bytes) -> list[bytes]:
    """The shadow of ``frames`` (written at ``start``) as parts to join after the frames."""
    head = _HEAD.pack(
        SHADOW_MAGIC, start, len(frames), first_lsn, last_lsn, xxhash.xxh3_64_intdigest(frames, seed=salt)
    )
    return [head, _U64.pack(xxhash.xxh3_64_intdigest(head, seed=salt)), _PAD, frames, _PAD]


def decode_shadow_at(data: bytes | memoryview, offset: int, salt: int) -> Shadow | None:
    """The shadow at ``offset`` if whole and valid for this segment life (``salt``), else None."""
    if offset + SHADOW_OVERHEAD > len(data):
        return None
    magic, start, length, first_lsn, last_lsn, copy_check = _HEAD.unpack_from(data, offset)
    if magic != SHADOW_MAGIC or start + length != offset or first_lsn > last_lsn:
        return None
    (head_check,) = _U64.unpack_from(data, offset + 48)
    if xxhash.xxh3_64_intdigest(data[offset : offset + 48], seed=salt) != head_check:
        return None
    begin = offset + SHADOW_HEADER_SIZE
    if begin + length > len(data):
        return None
    copy = bytes(data[begin : begin + length])
    if xxhash.xxh3_64_intdigest(copy, seed=salt) != copy_check:
        return None
    return Shadow(offset, start, first_lsn, last_lsn, copy)


def find_shadow(data: bytes, salt: int, offset: int, lsn: int) -> Shadow | None:
    """A valid shadow at or after ``offset`` covering ``lsn`` whose frames start at or before
    ``offset`` (the caller checks that they start where the log has that batch)."""
    pos = find_aligned(data, SHADOW_MAGIC, offset)
    while pos != -1:
        found = decode_shadow_at(data, pos, salt)
        if found is not None and found.start <= offset and found.first_lsn <= lsn <= found.last_lsn:
            return found
        pos = find_aligned(data, SHADOW_MAGIC, pos + 1)
    return None

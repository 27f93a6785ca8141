"""The high-water mark: how far the log was acknowledged, kept outside the segments.

A segment copied back from an older copy, or its last writes zeroed, reads exactly like a
log whose tail a crash tore off; the MANIFEST (written at checkpoints and segment starts)
knows nothing of what was acknowledged since. So after every group write, once the segments
are ``fdatasync``ed and before any committer is told, the log writes the last lsn of the
write and its frame's checksum into ``HIGHWATER`` and ``fdatasync``s it. An open then
refuses a log that ends before that lsn (rule ``high_water_lost``) or holds another frame
at it (``high_water_mismatch``). Because the mark is written only after the frames are
durable, a write torn by a crash was never marked, and its torn tail is still cut.

File layout (``HIGHWATER_SIZE`` bytes, created whole by atomic replace): two 64-byte slots at
offsets 0 and 512, written in turn, so a torn write of one leaves the other::

    0   8  magic      b"AWHWM\\x01\\x00\\x00"
    8  16  file_id    random, fixed for the file's life; the MANIFEST names it
    24  8  counter    increases by one per mark; the valid slot with the higher one counts
    32  8  lsn        the last acknowledged lsn
    40  8  check      the checksum field of that lsn's frame (0: not known, not compared)
    48  8  zero
    56  8  xxh3-64 of bytes 0..56
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import xxhash

from ..disk import FileHandle, StateRoot
from .errors import WalEvidenceError
from .log_frames import LogFrames

HIGHWATER = "HIGHWATER"
HIGHWATER_SIZE = 1024
MAGIC = b"AWHWM\x01\x00\x00"
SLOT_OFFSETS = (0, 512)
_REC = struct.Struct("<8s16sQQQ8x")
_U64 = struct.Struct("<Q")


class Mark(NamedTuple):
    file_id: bytes
    counter: int
    lsn: int
    check: int


def encode_mark(mark: Mark) -> bytes:
    body = _REC.pack(MAGIC, mark.file_id, mark.counter, mark.lsn, mark.check)
    return body + _U64.pack(xxhash.xxh3_64_intdigest(body))


def decode_mark(data: bytes, offset: int) -> Mark | None:
    """The mark in the slot at ``offset``, or None when it is not whole."""
    if offset + _REC.size + 8 > len(data):
        return None
    body = data[offset : offset + _REC.size]
    (check,) = _U64.unpack_from(data, offset + _REC.size)
    if xxhash.xxh3_64_intdigest(body) != check:
        return None
    magic, file_id, counter, lsn, frame_check = _REC.unpack(body)
    if magic != MAGIC:
        return None
    return Mark(file_id, counter, lsn, frame_check)


def read_mark(data: bytes, path: str, file_id: bytes) -> Mark:
    """The current mark of a ``HIGHWATER`` file's bytes, checked against the MANIFEST's id."""
    if len(data) != HIGHWATER_SIZE:
        raise WalEvidenceError(
            path, "high_water_damaged", f"{len(data)} bytes, the file has {HIGHWATER_SIZE}"
        )
    marks = [m for m in (decode_mark(data, off) for off in SLOT_OFFSETS) if m is not None]
    if not marks:
        raise WalEvidenceError(path, "high_water_damaged", "neither slot holds a whole mark")
    if any(m.file_id != file_id for m in marks):
        raise WalEvidenceError(path, "high_water_replaced", "not the HIGHWATER file the MANIFEST names")
    return max(marks, key=lambda m: m.counter)


def frame_check(frame: bytes) -> int:
    """The checksum field of an encoded frame (bytes 24..32 of its header)."""
    return int(_U64.unpack_from(frame, 24)[0])


def check_mark(mark: Mark, frames: LogFrames, next_lsn: int, path: str) -> None:
    """The log must reach the mark's lsn, and hold the marked frame when it still has it."""
    if next_lsn - 1 < mark.lsn:
        raise WalEvidenceError(
            path,
            "high_water_lost",
            f"the log ends at lsn {next_lsn - 1} but lsn {mark.lsn} was acknowledged "
            "(a log segment was rolled back, truncated or its tail zeroed)",
        )
    index = mark.lsn - frames.first_lsn
    if mark.check and 0 <= index < len(frames) and frames.checksum(index) != mark.check:
        raise WalEvidenceError(
            path, "high_water_mismatch", f"the log holds another transaction at acknowledged lsn {mark.lsn}"
        )


class HighWater:
    """The open ``HIGHWATER`` file of a log: :meth:`record` marks one durable write."""

    def __init__(self, root: StateRoot, handle: FileHandle, mark: Mark, *, sync: bool = True) -> None:
        self.root = root
        self.handle = handle
        self.mark = mark
        self.sync = sync

    @classmethod
    def create(cls, root: StateRoot, file_id: bytes, lsn: int, check: int) -> HighWater:
        """Write a new ``HIGHWATER`` (atomic replace, durable) marking ``lsn``; open it."""
        mark = Mark(file_id, 1, lsn, check)
        data = bytearray(HIGHWATER_SIZE)
        data[SLOT_OFFSETS[1] : SLOT_OFFSETS[1] + 64] = encode_mark(mark)
        root.write_atomic(HIGHWATER, bytes(data))
        return cls(root, root.open_file(HIGHWATER, writable=True), mark)

    @classmethod
    def open(cls, root: StateRoot, file_id: bytes) -> HighWater:
        """Open the ``HIGHWATER`` the MANIFEST names (``high_water_missing`` if gone)."""
        if not root.exists(HIGHWATER):
            raise WalEvidenceError(
                root.path(HIGHWATER),
                "high_water_missing",
                "the MANIFEST names it; it records the acknowledged lsn",
            )
        handle = root.open_file(HIGHWATER, writable=True)
        try:
            size = root.disk.fstat(handle.fd).st_size
            mark = read_mark(root.pread(handle, size, 0), handle.path, file_id)
        except BaseException:
            root.close(handle)
            raise
        return cls(root, handle, mark)

    def record(self, lsn: int, check: int) -> None:
        """Mark ``lsn`` (whose frames are durable) as acknowledged, durably, in the other slot."""
        mark = Mark(self.mark.file_id, self.mark.counter + 1, lsn, check)
        self.root.check_identity(self.handle, size=HIGHWATER_SIZE)
        self.root.pwrite(self.handle, encode_mark(mark), SLOT_OFFSETS[mark.counter % 2])
        if self.sync:
            self.root.fdatasync(self.handle)
        self.mark = mark

    def close(self) -> None:
        self.root.close(self.handle)

"""Segment slots and the synchronous write of one batch (frames + shadow per segment).

``SegmentLog`` owns the slots, the live chain and the tail; ``write_batch`` writes one group
of ``(lsn, payload)`` items durably. Group commit (``log.py``) holds one; an open fills it
from disk through :meth:`SegmentLog.adopt_slot` and :meth:`SegmentLog.resume`.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..disk import FileHandle, StateRoot, StorageFullError
from .errors import TransactionTooLarge
from .highwater import HighWater, frame_check
from .layout import ALIGN, SEGMENT_HEADER_SIZE, SegmentHeader, encode_frame, encode_segment_header, frame_size
from .options import WalOptions, WalStatistics
from .scan import NamedSegment
from .shadow import SHADOW_OVERHEAD, encode_shadow

SEGMENT_SUFFIX = ".seg"


@dataclass
class _Segment:
    slot: int
    handle: FileHandle
    size: int = 0  # bytes of the slot file
    header: SegmentHeader | None = None  # None: free slot
    named: bool = False  # header durable, so a MANIFEST may name this life


class SegmentLog:
    """The segment slots of a log in ``<root>/<rel_dir>`` and the synchronous batch write."""

    def __init__(self, root: StateRoot, rel_dir: str, options: WalOptions) -> None:
        self.root = root
        self.rel_dir = rel_dir
        self.options = options
        self.stats = WalStatistics()
        self._segments: dict[int, _Segment] = {}
        self._chain: list[int] = []  # slots of the live chain, in seq order
        self._tail: _Segment | None = None
        self._tail_offset = SEGMENT_HEADER_SIZE
        self._next_seq = 1
        self.durable_lsn = 0  # the last lsn whose frame is durable; the next write continues it
        self._write_lock = threading.Lock()
        self._closed = False
        self._frames_written = False
        # Called (in the writing thread, under the write lock) once a new segment life's
        # header is durable and before any frame is written into it; the record store names
        # the life in its MANIFEST there, so a named segment that is gone is proof of damage.
        self.on_segment_start: Callable[[], None] | None = None
        # Marked after every durable write, before anyone is told (``highwater.py``): the
        # evidence of how far the log was acknowledged that a segment cannot roll back with.
        self.high_water: HighWater | None = None

    def slot_rel(self, slot: int) -> str:
        return f"{self.rel_dir}/{slot:08d}{SEGMENT_SUFFIX}"

    # -- filling the view from disk (an open) --------------------------------------------------
    def adopt_slot(self, slot: int, handle: FileHandle, size: int) -> None:
        """Register a slot file found on disk; it counts as free until :meth:`resume`."""
        assert slot not in self._segments, f"slot {slot} adopted twice"
        self._segments[slot] = _Segment(slot, handle, size)

    def slot_handle(self, slot: int) -> FileHandle:
        return self._segments[slot].handle

    def resume(
        self,
        headers: Mapping[int, SegmentHeader],
        *,
        next_seq: int,
        durable_lsn: int,
        tail: tuple[int, int] | None,
    ) -> None:
        """End an open: ``headers`` are the live chain's slots (every other adopted slot is
        free), ``tail`` the ``(slot, offset)`` the next write appends at, or None when the next
        write starts a new segment life."""
        for seg in self._segments.values():
            seg.header, seg.named = None, False
        chain = sorted(headers, key=lambda slot: headers[slot].seq)
        seqs = [headers[slot].seq for slot in chain]
        assert all(a < b for a, b in itertools.pairwise(seqs)), f"chain seqs {seqs} repeat"
        assert not seqs or next_seq > seqs[-1], f"next seq {next_seq} is not past the chain {seqs}"
        assert durable_lsn >= 0
        for slot in chain:
            seg = self._segments[slot]
            seg.header, seg.named = headers[slot], True  # on disk already: durable
        self._chain = chain
        self._next_seq = next_seq
        self.durable_lsn = durable_lsn
        if tail is None:
            self.end_tail()
        else:
            slot, offset = tail
            assert chain and chain[-1] == slot, f"tail slot {slot} is not the chain's last"
            assert offset % ALIGN == 0 and SEGMENT_HEADER_SIZE <= offset <= self._segments[slot].size
            self._tail, self._tail_offset = self._segments[slot], offset

    def end_tail(self) -> int:
        """The next write starts a new segment life (a checkpoint rolls the log this way);
        return that life's seq."""
        self._tail = None
        self._tail_offset = SEGMENT_HEADER_SIZE
        return self._next_seq

    def live_segments(self, start_seq: int) -> list[NamedSegment]:
        """Segment lives of the chain from ``start_seq`` on whose header is durable."""
        out: list[NamedSegment] = []
        for slot in list(self._chain):
            seg = self._segments.get(slot)
            header = seg.header if seg is not None else None
            if seg is not None and header is not None and seg.named and header.seq >= start_seq:
                out.append(NamedSegment(slot, header.seq, header.salt, header.first_lsn, seg.size))
        return out

    # -- writing -----------------------------------------------------------------------------
    @property
    def log_bytes(self) -> int:
        return len(self._chain) * self.options.segment_size

    @property
    def needs_checkpoint(self) -> bool:
        return self.log_bytes >= self.options.max_log_bytes

    def check_payload(self, payload: bytes) -> None:
        if len(payload) > self.options.max_payload:
            raise TransactionTooLarge(
                f"transaction of {len(payload)} bytes exceeds {self.options.max_payload}"
            )

    def _free_slots(self) -> list[_Segment]:
        out = []
        for slot in sorted(s for s, seg in self._segments.items() if seg.header is None):
            seg = self._segments[slot]
            if self.root.disk.fstat(seg.handle.fd).st_size == self.options.segment_size:
                out.append(seg)
        return out

    def _new_slot(self) -> _Segment:
        free = self._free_slots()
        return free[0] if free else self._create_slot()

    def _create_slot(self) -> _Segment:
        """A new zero-filled slot, created whole or not at all (``StorageFullError``)."""
        slot = max(self._segments, default=-1) + 1
        handle = self.root.create_whole(
            self.slot_rel(slot), self.options.segment_size, zero_fill=self.options.zero_fill
        )
        seg = _Segment(slot, handle, self.options.segment_size)
        self._segments[slot] = seg
        return seg

    def _starts_life(self, present: bool, part_start: int, offset: int, size: int) -> bool:
        """Whether a frame of ``size`` at ``offset`` must go to a new segment life: there is
        no tail, or the write's part in this segment (from ``part_start``) and its shadow
        would not fit."""
        end = offset + size
        return not present or end + SHADOW_OVERHEAD + (end - part_start) > self.options.segment_size

    def _slots_needed(self, items: Sequence[tuple[int, bytes]]) -> int:
        """How many new segment lives writing ``items`` will start."""
        need = 0
        offset = part_start = self._tail_offset
        present = self._tail is not None
        for _, payload in items:
            size = frame_size(len(payload))
            if self._starts_life(present, part_start, offset, size):
                need += 1
                offset = part_start = SEGMENT_HEADER_SIZE
                present = True
            offset += size
        return need

    def fits_tail(self, items: Sequence[tuple[int, bytes]]) -> bool:
        """Whether ``items`` go into the current tail segment: no new segment life, so no
        slot to create (a zero fill) and no MANIFEST to write for one."""
        return self._slots_needed(items) == 0

    def _prepare_slots(self, items: Sequence[tuple[int, bytes]]) -> int:
        """Make sure the free slots can take every new segment life the batch starts; return
        how many lives it starts (most batches: none, and then no slot is looked at)."""
        # Before the first byte of the batch is written: running out of space here leaves
        # the log exactly as it was, so the batch can be refused without poisoning the root.
        lives = self._slots_needed(items)
        if lives:  # the free-slot scan costs an fstat per slot: only when a life starts
            for _ in range(lives - len(self._free_slots())):
                self._create_slot()
        return lives

    def write_batch(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Write ``(lsn, payload)`` items as one durable batch (synchronous; the leader's job).

        Lsns must continue the log. Returns after every touched segment is fdatasynced.
        """
        if not items:
            return
        with self._write_lock:
            self.root.check_writable()
            # The group-commit layer hands out lsns in order and never leaves a hole.
            assert items[0][0] == self.durable_lsn + 1, f"batch at lsn {items[0][0]} after {self.durable_lsn}"
            assert items[-1][0] - items[0][0] == len(items) - 1, "a batch's lsns are contiguous"
            try:
                new_lives = self._prepare_slots(items)
            except StorageFullError:
                raise  # nothing written (the root noted it)
            except Exception as exc:
                self.root.fail(exc)
                raise
            self._frames_written = False
            try:
                self._write_batch(items, new_lives)
                self.root.full = None
            except StorageFullError as exc:
                if self._frames_written:
                    self.root.fail(exc)
                # else refused before any frame was written: the log is as it was
                raise
            except Exception as exc:
                # A batch that failed midway leaves this object's tail, lsns and segment
                # headers ahead of (or apart from) the files: poison the root so that no later
                # commit is written on top of that; a reopen rebuilds the view from disk.
                self.root.fail(exc)
                raise

    def _start_lives(self, items: Sequence[tuple[int, bytes]]) -> list[_Segment]:
        """Start, before any frame of the batch is written, every segment life it needs.

        With a MANIFEST to keep (``on_segment_start``): each header is written and made
        durable, then the MANIFEST names the lives; no crash can leave a named life without
        its header. If naming fails for lack of space the lives are forgotten again (their
        headers are zeroed again; a crash before that leaves an empty unnamed life, which
        replay passes over) and ``StorageFullError`` leaves the log as it was.
        """
        lives: list[_Segment] = []
        offset = part_start = self._tail_offset
        present = self._tail is not None
        for lsn, payload in items:
            size = frame_size(len(payload))
            if self._starts_life(present, part_start, offset, size):
                seg = self._new_slot()
                seg.header = SegmentHeader(self._next_seq, secrets.randbits(64) | 1, lsn)
                seg.named = self.on_segment_start is None
                self._next_seq += 1
                lives.append(seg)
                offset = part_start = SEGMENT_HEADER_SIZE
                present = True
            offset += size
        if not lives or self.on_segment_start is None:
            return lives
        for seg in lives:
            assert seg.header is not None
            self._pwrite(seg, [encode_segment_header(seg.header)], 0)
            self.root.fdatasync(seg.handle)
            seg.named = True
            self._chain.append(seg.slot)
        try:
            self.on_segment_start()
        except StorageFullError:
            # Unname the lives on disk too (zero their headers) and hand their seqs out
            # again: a stray header with a seq the next life also takes would read as a gap.
            for seg in lives:
                self._pwrite(seg, [b"\x00" * SEGMENT_HEADER_SIZE], 0)
                self.root.fdatasync(seg.handle)
                seg.header, seg.named = None, False
                self._chain.remove(seg.slot)
            self._next_seq -= len(lives)
            raise
        return lives

    def _write_batch(self, items: Sequence[tuple[int, bytes]], new_lives: int) -> None:
        self.root.check_writable()
        batch_start = items[0][0]
        lives = iter(self._start_lives(items) if new_lives else ())
        self._frames_written = True
        touched: list[_Segment] = []
        head: list[bytes] = []  # the segment header, when it is not durable yet
        parts: list[bytes] = []
        part_offset = self._tail_offset
        part_first = batch_start
        seg = self._tail
        for lsn, payload in items:
            size = frame_size(len(payload))
            if self._starts_life(seg is not None, part_offset, self._tail_offset, size):
                if seg is not None and parts:
                    self._write_part(seg, head, parts, part_offset, part_first, lsn - 1)
                seg = next(lives)
                assert seg.header is not None and seg.header.first_lsn == lsn
                self._tail = seg
                self._tail_offset = part_offset = SEGMENT_HEADER_SIZE
                part_first = lsn
                if self.on_segment_start is not None:
                    head = []  # header already durable
                else:
                    self._chain.append(seg.slot)
                    head = [encode_segment_header(seg.header)]
            assert seg is not None  # a missing tail always starts a life
            if seg not in touched:
                touched.append(seg)
            assert seg.header is not None
            parts.append(encode_frame(seg.header.salt, lsn, batch_start, payload))
            self._tail_offset += size
        assert seg is not None
        last_check = frame_check(parts[-1])
        self._write_part(seg, head, parts, part_offset, part_first, items[-1][0])
        for s in touched:
            # The size too: a segment cut while we serve would take acknowledged frames with
            # it, and writes past the cut would land beyond a hole (refused from here on).
            self.root.check_identity(s.handle, size=s.size)
            if not self.options.unsafe_no_fsync:
                began = time.perf_counter()
                self.root.fdatasync(s.handle)
                self.stats.observe_fsync(time.perf_counter() - began)
        if self.high_water is not None:
            self.high_water.record(items[-1][0], last_check)
        self.durable_lsn = items[-1][0]
        self.stats.batches += 1
        self.stats.commits += len(items)
        self.stats.max_batch = max(self.stats.max_batch, len(items))

    def _write_part(
        self, seg: _Segment, head: list[bytes], parts: list[bytes], offset: int, first: int, last: int
    ) -> None:
        """Write one segment's part of a batch (frames ``first..last`` from ``offset``) and its
        shadow behind it, with the segment header in front when that is not durable yet."""
        assert seg.header is not None
        frames = b"".join(parts)
        self.stats.frame_bytes += len(frames)
        shadow = encode_shadow(seg.header.salt, offset, first, last, frames)
        self._pwrite(seg, [*head, frames, *shadow], offset - SEGMENT_HEADER_SIZE if head else offset)
        parts.clear()

    def _pwrite(self, seg: _Segment, parts: list[bytes], offset: int) -> None:
        data = b"".join(parts)
        # Before writing too (not only before the fdatasync): bytes sent through a stale
        # descriptor would land in whatever file the old inode now is.
        self.root.check_identity(seg.handle, size=seg.size)
        self.root.pwrite(seg.handle, data, offset)
        self.stats.bytes_written += len(data)
        parts.clear()

    def retire_before(self, start_seq: int) -> None:
        with self._write_lock:  # a group write may be choosing segments in its thread
            self._retire_before(start_seq)

    def _retire_before(self, start_seq: int) -> None:
        keep: list[int] = []
        for slot in self._chain:
            seg = self._segments[slot]
            if seg.header is not None and seg.header.seq < start_seq:
                seg.header = None
            else:
                keep.append(slot)
        self._chain = keep

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        self._closed = True
        for seg in self._segments.values():
            self.root.close(seg.handle)
        self._segments.clear()
        if self.high_water is not None:
            self.high_water.close()

"""The write-ahead log: preallocated segments, group commit, idempotent replay.

A transaction's payload is opaque bytes (the record store encodes its operations). ``commit``
returns the transaction's lsn only after an fdatasync that covers its frame has returned;
concurrent committers share that fdatasync (group commit). The first committer to find no
flush in progress becomes the leader: it takes every queued payload, writes them with one
``pwrite`` per segment and one ``fdatasync`` per touched segment, wakes the waiters, and
repeats until the queue is empty.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel

from ..disk import FileHandle, StateRoot, StorageFullError
from .errors import TransactionTooLarge, WalClosedError
from .frame import (
    SEGMENT_HEADER_SIZE,
    Frame,
    SegmentHeader,
    encode_frame,
    encode_segment_header,
    frame_size,
)
from .scan import NamedSegment, Restore, SegmentImage, check_acked, check_named, scan_chain
from .shadow import SHADOW_OVERHEAD, encode_shadow

log = logging.getLogger("afterword.wal")
MiB = 1024 * 1024
SEGMENT_SUFFIX = ".seg"

# fsync latency histogram bucket upper bounds, seconds (exponential, as etcd does).
FSYNC_BUCKETS: tuple[float, ...] = tuple(0.0001 * 2**i for i in range(16))


@dataclass(frozen=True)
class WalOptions:
    """Bounds and test hooks of the log.

    ``zero_fill`` writes real zeros into new segments so that later overwrites need no
    metadata flush; tests may turn it off to save time. ``unsafe_no_fsync`` skips fdatasync
    and exists only for measuring the cost of everything else (never for real data).
    """

    segment_size: int = 16 * MiB
    max_payload: int = 8 * MiB - 4096  # the largest frame and its shadow fit in a 16 MiB segment
    max_log_bytes: int = 64 * MiB
    zero_fill: bool = True
    unsafe_no_fsync: bool = False

    def __post_init__(self) -> None:
        if self.segment_size < SEGMENT_HEADER_SIZE + 2 * frame_size(self.max_payload) + SHADOW_OVERHEAD:
            # Every write carries a shadow copy of itself (``shadow.py``), so that damage to
            # the last write is repaired from the copy instead of being cut as a torn write.
            raise ValueError("segment_size must hold the segment header and the largest frame twice (frame + shadow)")
        if self.segment_size % 8:
            raise ValueError("segment_size must be a multiple of 8")


@dataclass
class WalStatistics:
    commits: int = 0
    batches: int = 0
    fsyncs: int = 0
    bytes_written: int = 0
    max_batch: int = 0
    fsync_seconds_total: float = 0.0
    fsync_buckets: list[int] = field(default_factory=lambda: [0] * (len(FSYNC_BUCKETS) + 1))

    def observe_fsync(self, seconds: float) -> None:
        self.fsyncs += 1
        self.fsync_seconds_total += seconds
        for i, bound in enumerate(FSYNC_BUCKETS):
            if seconds <= bound:
                self.fsync_buckets[i] += 1
                return
        self.fsync_buckets[-1] += 1


class _Batch:
    __slots__ = ("done", "error", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.done = False
        self.error: BaseException | None = None


@dataclass
class _Segment:
    slot: int
    handle: FileHandle
    size: int = 0  # bytes of the slot file
    header: SegmentHeader | None = None  # None: free slot
    named: bool = False  # header durable, so a MANIFEST may name this life


class WriteAheadLog:
    """A bounded write-ahead log in ``<root>/<rel_dir>``; open it with :meth:`open`."""

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
        self.next_lsn = 1
        self.durable_lsn = 0
        self._write_lock = threading.Lock()
        self._pending: list[tuple[int, bytes]] = []
        self._open_batch = _Batch()
        self._leader = False
        self._closed = False
        self._frames_written = False
        # Called (in the writing thread, under the write lock) once a new segment life's
        # header is durable and before any frame is written into it; the record store names
        # the life in its MANIFEST there, so a named segment that is gone is proof of damage.
        self.on_segment_start: Callable[[], None] | None = None
        # Called (in the event loop) when a group write ran out of space before writing
        # anything: every lsn from the argument on is void and will be assigned again.
        self.on_rollback: Callable[[int], None] | None = None

    # -- opening and replay ------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        root: StateRoot,
        *,
        rel_dir: str = "wal",
        start_seq: int,
        checkpoint_lsn: int,
        options: WalOptions | None = None,
        named: Sequence[NamedSegment] = (),
        acked_lsn: int = 0,
        before_free: Callable[[list[int]], None] | None = None,
    ) -> tuple[WriteAheadLog, list[Frame]]:
        """Open (creating if needed) and return the log plus the frames to replay.

        ``named`` and ``acked_lsn`` are the MANIFEST's evidence: every named segment life
        must be present and the log must reach ``acked_lsn``, else ``WalEvidenceError``
        before anything is repaired. ``before_free(slots)`` runs before named segments past
        the end of the log (leftovers of a torn write) are freed, so the caller can stop
        naming them first.
        """
        wal = cls(root, rel_dir, options or WalOptions())
        try:
            frames = wal._recover(start_seq, checkpoint_lsn, list(named), acked_lsn, before_free)
        except BaseException:
            wal.close()  # a refused open must not leak segment descriptors
            raise
        return wal, frames

    def _slot_rel(self, slot: int) -> str:
        return f"{self.rel_dir}/{slot:08d}{SEGMENT_SUFFIX}"

    def _recover(
        self,
        start_seq: int,
        checkpoint_lsn: int,
        named: list[NamedSegment],
        acked_lsn: int,
        before_free: Callable[[list[int]], None] | None,
    ) -> list[Frame]:
        root = self.root
        root.ensure_dir(self.rel_dir)
        root.remove_temporaries(self.rel_dir)
        images: list[SegmentImage] = []
        max_seq = start_seq - 1
        for name in root.listdir(self.rel_dir):
            if not name.endswith(SEGMENT_SUFFIX):
                continue
            slot = int(name[: -len(SEGMENT_SUFFIX)])
            handle = root.open_file(self._slot_rel(slot), writable=True)
            size = root.disk.fstat(handle.fd).st_size
            # A slot of another size was made by another configuration or is damaged; it is
            # never reused, and a named one fails the evidence check below.
            self._segments[slot] = _Segment(slot, handle, size)
            images.append(SegmentImage(slot, root.pread(handle, size, 0)))
        wal_path = root.path(self.rel_dir)
        check_named(named, images, start_seq=start_seq, wal_path=wal_path)
        plan = scan_chain(
            images,
            start_seq=start_seq,
            checkpoint_lsn=checkpoint_lsn,
            max_payload=self.options.max_payload,
        )
        check_acked(plan.next_lsn, acked_lsn, wal_path)
        from .frame import decode_segment_header

        by_slot = {img.slot: img for img in images}
        for slot, seg in self._segments.items():
            image = by_slot.get(slot)
            header = decode_segment_header(image.data) if image is not None else None
            # Only the live chain counts towards the next seq. A segment past the end (its
            # header durable, the write before it lost) is zeroed below; counting its seq would
            # leave a gap in the chain the next segment extends, which scan_chain rejects.
            if header is not None and header.seq >= start_seq and slot not in plan.free_slots:
                max_seq = max(max_seq, header.seq)
                seg.header = header
        for restore in plan.restores:
            self._restore(restore, by_slot)
        if plan.repair is not None:
            self._repair(plan.repair.slot, plan.repair.start, plan.repair.stop, by_slot)
            log.warning(
                "wal: cut a torn tail of %s (bytes %d-%d) after lsn %d; the MANIFEST records "
                "lsn %d as the last acknowledged, so the cut frames were never acknowledged",
                root.path(self._slot_rel(plan.repair.slot)),
                plan.repair.start,
                plan.repair.stop,
                plan.next_lsn - 1,
                acked_lsn,
            )
        named_slots = {ref.slot for ref in named}
        freed_named = [slot for slot in plan.free_slots if slot in named_slots]
        if freed_named and before_free is not None:
            before_free(freed_named)
        for slot in plan.free_slots:
            log.warning(
                "wal: freed %s: it held only leftovers of a torn write after lsn %d",
                root.path(self._slot_rel(slot)),
                plan.next_lsn - 1,
            )
            seg = self._segments[slot]
            root.pwrite(seg.handle, b"\x00" * SEGMENT_HEADER_SIZE, 0)
            root.fdatasync(seg.handle)
            seg.header = None
        self._chain = sorted(
            (s.slot for s in self._segments.values() if s.header is not None),
            key=lambda slot: self._segments[slot].header.seq,  # type: ignore[union-attr]
        )
        self._next_seq = max_seq + 1
        self.next_lsn = plan.next_lsn
        self.durable_lsn = plan.next_lsn - 1
        if plan.tail_header is not None and plan.tail_header.version >= 4:
            self._tail = self._segments[plan.tail_slot]  # type: ignore[index]
            self._tail_offset = plan.tail_offset
        # A v3 tail (written before shadows) is left as it is: the next write starts a v4
        # life, so every frame written from now on has a shadow behind its write.
        for slot in self._chain:
            self._segments[slot].named = True  # on disk already: durable
        return plan.frames

    def _save_broken(self, slot: int, images: dict[int, SegmentImage]) -> str:
        root = self.root
        n = 0
        while root.exists(f"{self.rel_dir}/{slot:08d}.broken.{n}"):
            n += 1
        root.write_atomic(f"{self.rel_dir}/{slot:08d}.broken.{n}", images[slot].data)
        return root.path(f"{self.rel_dir}/{slot:08d}.broken.{n}")

    def _restore(self, restore: Restore, images: dict[int, SegmentImage]) -> None:
        """Rewrite a damaged write from its shadow, durably, keeping the damaged bytes aside."""
        saved = self._save_broken(restore.slot, images)
        seg = self._segments[restore.slot]
        self.root.pwrite(seg.handle, restore.data, restore.offset)
        self.root.fdatasync(seg.handle)
        log.warning(
            "wal: restored lsn %d-%d of %s (bytes %d-%d) from the shadow copy of their write: "
            "the frames were damaged after the write reached the disk whole; damaged bytes "
            "saved as %s",
            restore.first_lsn,
            restore.last_lsn,
            self.root.path(self._slot_rel(restore.slot)),
            restore.offset,
            restore.offset + len(restore.data),
            saved,
        )

    def _repair(self, slot: int, start: int, stop: int, images: dict[int, SegmentImage]) -> None:
        """Save the damaged segment aside, then zero the torn tail so it is never reread."""
        root = self.root
        self._save_broken(slot, images)
        seg = self._segments[slot]
        root.pwrite(seg.handle, b"\x00" * (stop - start), start)
        root.fdatasync(seg.handle)

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
            self._slot_rel(slot), self.options.segment_size, zero_fill=self.options.zero_fill
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

    def _prepare_slots(self, items: Sequence[tuple[int, bytes]]) -> None:
        # Before the first byte of the batch is written: running out of space here leaves
        # the log exactly as it was, so the batch can be refused without poisoning the root.
        need = self._slots_needed(items) - len(self._free_slots())
        for _ in range(need):
            self._create_slot()

    def write_batch(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Write ``(lsn, payload)`` items as one durable batch (synchronous; the leader's job).

        Lsns must continue the log. Returns after every touched segment is fdatasynced.
        """
        if not items:
            return
        with self._write_lock:
            self.root.check_writable()
            try:
                self._prepare_slots(items)
            except StorageFullError:
                raise  # nothing written (the root noted it)
            except Exception as exc:
                self.root.fail(exc)
                raise
            self._frames_written = False
            try:
                self._write_batch(items)
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

    def _write_batch(self, items: Sequence[tuple[int, bytes]]) -> None:
        self.root.check_writable()
        batch_start = items[0][0]
        lives = iter(self._start_lives(items))
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
        self._write_part(seg, head, parts, part_offset, part_first, items[-1][0])
        for s in touched:
            self.root.check_identity(s.handle)
            if not self.options.unsafe_no_fsync:
                began = time.perf_counter()
                self.root.fdatasync(s.handle)
                self.stats.observe_fsync(time.perf_counter() - began)
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
        shadow = encode_shadow(seg.header.salt, offset, first, last, frames)
        self._pwrite(seg, [*head, frames, *shadow], offset - SEGMENT_HEADER_SIZE if head else offset)
        parts.clear()

    def _pwrite(self, seg: _Segment, parts: list[bytes], offset: int) -> None:
        data = b"".join(parts)
        # Before writing too (not only before the fdatasync): bytes sent through a stale
        # descriptor would land in whatever file the old inode now is.
        self.root.check_identity(seg.handle)
        self.root.pwrite(seg.handle, data, offset)
        self.stats.bytes_written += len(data)
        parts.clear()

    def append_sync(self, payload: bytes) -> int:
        """Commit one payload synchronously (for tools and single-threaded callers)."""
        self._check_open()
        self.check_payload(payload)
        if self._pending:
            # Queued async payloads hold lower lsns; writing this one first would put the log
            # out of order (read back as lost data). Only a caller inside the event loop can
            # get here, while a group write is in flight.
            raise RuntimeError("append_sync while asynchronous commits are queued; await flush()")
        lsn = self.next_lsn
        self.next_lsn += 1
        try:
            self.write_batch([(lsn, payload)])
        except BaseException:
            self.next_lsn = lsn  # nothing acknowledged; the root is poisoned anyway
            raise
        return lsn

    def reserve(self, payload: bytes) -> tuple[int, _Batch]:
        """Queue ``payload`` for the next group write; returns its lsn and batch.

        Call :meth:`wait` to make it durable. Splitting the two lets a caller assign the lsn
        and update its own bookkeeping with no await in between.
        """
        self._check_open()
        self.root.check_writable()
        self.check_payload(payload)
        lsn = self.next_lsn
        self.next_lsn += 1
        self._pending.append((lsn, payload))
        return lsn, self._open_batch

    async def wait(self, batch: _Batch) -> None:
        """Return once ``batch`` is durable; raise the write's error if it failed."""
        while not batch.done:
            if self._leader:
                # Woken when the batch is written, or when the leader leaves it behind.
                await batch.event.wait()
                continue
            await self._lead()
            if not batch.done:
                # A leader pass that ends normally drains the queue, so a batch it left
                # untaken is the open batch and holds nothing (flush() waits this way).
                return
        if batch.error is not None:
            raise batch.error

    async def _lead(self) -> None:
        """Write queued batches until the queue is empty (the group-commit leader's loop)."""
        self._leader = True
        try:
            # Yield once before taking the queue: the committers woken by the previous batch
            # are ready to run and re-queue now. Taking the queue at once would write a batch
            # of one and leave them the next fsync, halving commits per fsync under load.
            await anyio.lowlevel.cancel_shielded_checkpoint()
            while self._pending:
                items, self._pending = self._pending, []
                current, self._open_batch = self._open_batch, _Batch()
                try:
                    # Shielded: once items leave the queue their lsns are spent, so they must
                    # reach write_batch even if the leader is cancelled; dropping them would
                    # leave a hole that makes every later frame look like lost data.
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(self.write_batch, items)
                except BaseException as exc:
                    current.error = exc
                    if isinstance(exc, StorageFullError) and self.root.failed is None:
                        self._void_from(items[0][0], exc)
                    raise
                finally:
                    current.done = True
                    current.event.set()
                # No cancellation point here: a leader that stopped early could leave payloads
                # queued with every follower cancelled too (a task-group shutdown), and a later
                # write would then skip their lsns. A cancelled leader drains, then returns.
        finally:
            self._leader = False
            # Wake the waiters of the batch this leader did not take (after a failed write, or
            # flush() on the empty open batch) so one of them leads. The batch gets a fresh
            # event first: only a leader swaps events, so a follower that keeps waiting never
            # waits on an event nobody will set.
            stranded = self._open_batch
            woken, stranded.event = stranded.event, anyio.Event()
            woken.set()

    def _void_from(self, first_lsn: int, exc: StorageFullError) -> None:
        """A batch was refused before anything was written: its lsns and those queued after
        it are void. Fail every waiter and hand the lsns out again, so the log never holds
        a hole (which replay would read as lost data)."""
        self.next_lsn = first_lsn
        self._pending = []
        stranded, self._open_batch = self._open_batch, _Batch()
        stranded.error = exc
        stranded.done = True
        stranded.event.set()
        if self.on_rollback is not None:
            self.on_rollback(first_lsn)

    async def commit(self, payload: bytes) -> int:
        """Append ``payload`` durably and return its lsn (group commit)."""
        lsn, batch = self.reserve(payload)
        await self.wait(batch)
        return lsn

    # -- checkpoint support ------------------------------------------------------------------
    async def flush(self) -> None:
        """Make every queued payload durable (used before a checkpoint)."""
        while self._pending or self._leader:
            await self.wait(self._open_batch)

    def roll(self) -> tuple[int, int]:
        """Start a new segment for the next write; return ``(start_seq, checkpoint_lsn)``.

        Everything up to ``checkpoint_lsn`` lives in the segments before ``start_seq``; once a
        manifest naming both is durable, :meth:`retire_before` frees those segments.
        """
        if self._pending or self._leader:
            raise RuntimeError("roll with transactions still queued")
        self._tail = None
        self._tail_offset = SEGMENT_HEADER_SIZE
        return self._next_seq, self.next_lsn - 1

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
    def _check_open(self) -> None:
        if self._closed:
            raise WalClosedError("write-ahead log is closed")

    def close(self) -> None:
        self._closed = True
        for seg in self._segments.values():
            self.root.close(seg.handle)
        self._segments.clear()

    def __repr__(self) -> str:
        return (
            f"<WriteAheadLog next_lsn={self.next_lsn} segments={len(self._chain)} "
            f"commits={self.stats.commits} fsyncs={self.stats.fsyncs}>"
        )

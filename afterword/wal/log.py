"""The write-ahead log: preallocated segments, group commit, idempotent replay.

A transaction's payload is opaque bytes (the record store encodes its operations). ``commit``
returns the transaction's lsn only after an fdatasync that covers its frame has returned;
concurrent committers share that fdatasync (group commit). The first committer to find no
flush in progress becomes the leader: it takes every queued payload, writes them with one
``pwrite`` per segment and one ``fdatasync`` per touched segment, wakes the waiters, and
repeats until the queue is empty.

``WriteAheadLog`` is that group commit only. It holds the segments and their synchronous
batch write (a :class:`~afterword.wal.segments.SegmentLog`) and hands lsns out; the open
fills the segments from disk (``recovery.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import anyio.lowlevel

from ..disk import StateRoot, StorageFullError
from .committer import Committer
from .errors import WalClosedError
from .highwater import HighWater
from .log_frames import LogFrames
from .options import FSYNC_BUCKETS, WalOptions, WalStatistics
from .recovery import recover
from .scan import NamedSegment
from .segments import SegmentLog

__all__ = ["FSYNC_BUCKETS", "WalOptions", "WalStatistics", "WriteAheadLog"]


class _Batch:
    """One group write's waiters. The event is made only when a follower waits on it: a lone
    committer leads its own batch and never needs one."""

    __slots__ = ("_event", "done", "error")

    def __init__(self) -> None:
        self._event: anyio.Event | None = None
        self.done = False
        self.error: BaseException | None = None

    async def wait_done(self) -> None:
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()

    def wake(self) -> None:
        """Wake every follower waiting now; a later one waits on a fresh event."""
        woken, self._event = self._event, None
        if woken is not None:
            woken.set()


class WriteAheadLog:
    """A bounded write-ahead log in ``<root>/<rel_dir>``; open it with :meth:`open`."""

    def __init__(self, root: StateRoot, rel_dir: str, options: WalOptions) -> None:
        self._segments = SegmentLog(root, rel_dir, options)
        self.next_lsn = 1  # the next lsn to hand out; every lower one is durable or queued
        self._closed = False
        self._pending: list[tuple[int, bytes]] = []
        self._open_batch = _Batch()
        self._leader = False
        # Called (in the event loop) when a group write ran out of space before writing
        # anything: every lsn from the argument on is void and will be assigned again.
        self.on_rollback: Callable[[int], None] | None = None
        segments = self._segments
        self._committer = Committer(segments.write_batch, options.inline_commit_max_s, segments.fits_tail)

    # -- the segments, seen from outside -------------------------------------------------------
    @property
    def root(self) -> StateRoot:
        return self._segments.root

    @property
    def options(self) -> WalOptions:
        return self._segments.options

    @property
    def stats(self) -> WalStatistics:
        return self._segments.stats

    @property
    def durable_lsn(self) -> int:
        return self._segments.durable_lsn

    @property
    def log_bytes(self) -> int:
        return self._segments.log_bytes

    @property
    def needs_checkpoint(self) -> bool:
        return self._segments.needs_checkpoint

    @property
    def on_segment_start(self) -> Callable[[], None] | None:
        """Called once a new segment life's header is durable (``SegmentLog``)."""
        return self._segments.on_segment_start

    @on_segment_start.setter
    def on_segment_start(self, hook: Callable[[], None] | None) -> None:
        self._segments.on_segment_start = hook

    @property
    def high_water(self) -> HighWater | None:
        """Marked after every durable write, before anyone is told (``highwater.py``)."""
        return self._segments.high_water

    @high_water.setter
    def high_water(self, mark: HighWater | None) -> None:
        self._segments.high_water = mark

    def live_segments(self, start_seq: int) -> list[NamedSegment]:
        return self._segments.live_segments(start_seq)

    def retire_before(self, start_seq: int) -> None:
        self._segments.retire_before(start_seq)

    def check_payload(self, payload: bytes) -> None:
        self._segments.check_payload(payload)

    def write_batch(self, items: Sequence[tuple[int, bytes]]) -> None:
        """Write ``items`` durably now (the leader's job; see ``SegmentLog.write_batch``)."""
        self._segments.write_batch(items)

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
        high_water: HighWater | None = None,
    ) -> tuple[WriteAheadLog, LogFrames]:
        """Open (creating if needed) and return the log plus the frames to replay (spans into
        the segments read, see ``log_frames.py``).

        ``named`` and ``acked_lsn`` are the MANIFEST's evidence: every named segment life
        must be present and the log must reach ``acked_lsn``, else ``WalEvidenceError``
        before anything is repaired. ``before_free(slots)`` runs before named segments past
        the end of the log (leftovers of a torn write) are freed, so the caller can stop
        naming them first. ``high_water`` (``highwater.py``), when given, is checked the same
        way before anything is repaired, then marked after every write from now on (the log
        closes it).
        """
        wal = cls(root, rel_dir, options or WalOptions())
        try:
            frames = recover(
                wal._segments,
                start_seq=start_seq,
                checkpoint_lsn=checkpoint_lsn,
                named=list(named),
                acked_lsn=acked_lsn,
                before_free=before_free,
                high_water=high_water,
            )
        except BaseException:
            wal.close()  # a refused open must not leak segment descriptors
            if high_water is not None:
                high_water.close()
            raise
        wal.next_lsn = wal.durable_lsn + 1
        if high_water is not None:
            high_water.sync = not wal.options.unsafe_no_fsync
            wal.high_water = high_water
        return wal, frames

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
                await batch.wait_done()
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
                    if not self._committer.write_inline(items):
                        with anyio.CancelScope(shield=True):
                            await self._committer.write_off_loop(items)
                except BaseException as exc:
                    current.error = exc
                    if isinstance(exc, StorageFullError) and self.root.failed is None:
                        self._void_from(items[0][0], exc)
                    raise
                else:
                    # Whoever is woken next may be acknowledged: its frame must be durable.
                    assert self._segments.durable_lsn == items[-1][0], "a batch is durable before its wake-up"
                finally:
                    current.done = True
                    current.wake()
                # No cancellation point here: a leader that stopped early could leave payloads
                # queued with every follower cancelled too (a task-group shutdown), and a later
                # write would then skip their lsns. A cancelled leader drains, then returns.
        finally:
            self._leader = False
            # Wake the waiters of the batch this leader did not take (after a failed write, or
            # flush() on the empty open batch) so one of them leads. wake() drops the event:
            # a follower that keeps waiting makes a fresh one, which the next leader sets.
            self._open_batch.wake()

    def _void_from(self, first_lsn: int, exc: StorageFullError) -> None:
        """A batch was refused before anything was written: its lsns and those queued after
        it are void. Fail every waiter and hand the lsns out again, so the log never holds
        a hole (which replay would read as lost data)."""
        self.next_lsn = first_lsn
        self._pending = []
        stranded, self._open_batch = self._open_batch, _Batch()
        stranded.error = exc
        stranded.done = True
        stranded.wake()
        if self.on_rollback is not None:
            self.on_rollback(first_lsn)

    async def commit(self, payload: bytes) -> int:
        """Append ``payload`` durably and return its lsn (group commit)."""
        lsn, batch = self.reserve(payload)
        await self.wait(batch)
        return lsn

    @property
    def commit_stall_max_s(self) -> float:
        """The longest the event loop was held by one commit's inline write, seconds."""
        return self._committer.longest_inline_s

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
        assert self.next_lsn == self.durable_lsn + 1, "nothing queued, so everything handed out is durable"
        return self._segments.end_tail(), self.durable_lsn

    # -- lifecycle ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise WalClosedError("write-ahead log is closed")

    def close(self) -> None:
        self._closed = True
        self._segments.close()

    def __repr__(self) -> str:
        return (
            f"<WriteAheadLog next_lsn={self.next_lsn} segments={self.log_bytes // self.options.segment_size} "
            f"commits={self.stats.commits} fsyncs={self.stats.fsyncs}>"
        )

"""The ``per-record-v5`` record store: WAL commits, per-record files, in-memory state.

The directory's layout (owner.db, secret, MANIFEST, HIGHWATER, CATALOG, wal/, records/) and
each file's rules are specified in docs/storage-format.md. A mutation is a transaction committed to the WAL; memory changes only after the fdatasync
that covers it. A checkpoint writes the records changed since the previous one as files
(atomic replace, one directory fsync per batch), then the catalog and a new manifest, and
only then releases the WAL segments it covered. Replay applies an after-image only when its
lsn is newer than the record's, so replaying a transaction twice equals replaying it once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import anyio

from ..disk import Disk, StateRoot, storage_errno
from ..wal import WriteAheadLog
from .checkpoint import CheckpointImage, deferred_if_full, deferred_if_full_async, write_checkpoint
from .codec import FORMAT, Manifest, Op
from .errors import OwnershipLostError, StoreClosedError
from .evidence import Digest
from .manifest import ManifestKeeper
from .memory import CommittedState
from .ownership import OwnershipLock
from .recovery import recover
from .transactions import build_transaction
from .types import (
    MAX_RECORD_BYTES,
    Delete,
    Mutation,
    Put,
    Record,
    StoreOptions,
    StoreStatistics,
    Summarizer,
    TransactionInfo,
    Watcher,
)

__all__ = [
    "MAX_RECORD_BYTES",
    "Delete",
    "Mutation",
    "PendingCommit",
    "Put",
    "Record",
    "RecordStore",
    "StoreOptions",
    "StoreStatistics",
    "TransactionInfo",
    "Watcher",
]

log = logging.getLogger("afterword.store")


class PendingCommit:
    """A reserved transaction (see :meth:`RecordStore.reserve`)."""

    __slots__ = ("batch", "lsn", "store")

    def __init__(self, store: RecordStore, lsn: int, batch: Any) -> None:
        self.store = store
        self.lsn = lsn
        self.batch = batch

    async def wait(self) -> int:
        """Return the lsn once the transaction is durable and applied."""
        return await self.store._complete(self)


class RecordStore:
    """An open state directory. Use :meth:`open`; close with :meth:`close`."""

    format = FORMAT

    def __init__(self) -> None:  # use RecordStore.open
        self.root: StateRoot
        self.options: StoreOptions
        self.secret: bytes
        self._manifests: ManifestKeeper
        self._lock: OwnershipLock | None = None
        self._wal: WriteAheadLog
        self._state = CommittedState()
        self._inflight: dict[str, tuple[int, bool]] = {}  # key -> (lsn, exists) not yet durable
        self._unapplied: deque[tuple[int, tuple[Op, ...]]] = deque()
        self._durable_lsn = 0
        self._closed = False
        self._checkpoint_lock = anyio.Lock()  # one checkpoint at a time
        self._gate = anyio.Lock(fast_acquire=True)  # held only while a checkpoint drains and rolls the log
        self._checkpoints = 0
        self._last_checkpoint_seconds = 0.0
        self.recovery_seconds = 0.0
        self.replayed = 0

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str, *, disk: Disk | None = None, options: StoreOptions | None = None) -> RecordStore:
        """Lock, validate, load and recover the store at ``path`` (created if absent)."""
        began = time.perf_counter()
        self = cls()
        self.options = options or StoreOptions()
        self.root = StateRoot(path, disk)
        self._lock = OwnershipLock.acquire(self.root)
        try:
            opened = recover(self.root, self.options, self._state)
            self._manifests, self._wal = opened.manifests, opened.wal
            self.secret = self._manifests.secret
            self.replayed = opened.replayed
            self._durable_lsn = self._wal.next_lsn - 1
            self._wal.on_segment_start = self._manifests.name_new_segment
            self._wal.on_rollback = self._void_from
            if self.manifest.format != FORMAT:
                log.warning("store: upgrading %s from %s to %s", self.root.root, self.manifest.format, FORMAT)
                self.checkpoint_sync()
            if not self.manifest.high_water:  # a new directory, or one written before the mark
                self._manifests.start_high_water(opened.last_check)
        except BaseException:
            if hasattr(self, "_wal"):
                self._wal.close()
            self._lock.release()
            raise
        self.recovery_seconds = time.perf_counter() - began
        return self

    # -- MANIFEST and the log's callbacks -------------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        """The MANIFEST as last written."""
        return self._manifests.current

    def _void_from(self, first_lsn: int) -> None:
        # The log refused a batch before writing it (no space): forget the transactions
        # from first_lsn on; their callers get StorageFullError and their lsns are reused.
        self._unapplied = deque(item for item in self._unapplied if item[0] < first_lsn)
        self._inflight = {}
        for lsn, ops in self._unapplied:
            for op in ops:
                self._inflight[op.key] = (lsn, op.value is not None)

    def storage_problem(self) -> tuple[str, str] | None:
        """``("storage_full" | "disk_failed", detail)`` while writes fail, else None.
        ``storage_full`` without a failed root clears by itself once space is freed; a failed
        root (a write or fsync failed midway) needs a restart."""
        failed = self.root.failed
        if failed is not None:
            return ("storage_full" if storage_errno(failed) else "disk_failed", str(failed))
        if self.root.full is not None:
            return "storage_full", str(self.root.full)
        return None

    def check_ownership(self) -> None:
        """Raise :class:`OwnershipLostError` if the state directory or its lock file was
        removed or replaced since this store opened it; every later write is then refused
        (``disk_failed``) until the process stops and a new one opens the directory."""
        if self._lock is not None:
            self._lock.check_or_fail()

    # -- reading -----------------------------------------------------------------------------
    def get(self, key: str) -> Record | None:
        """The committed record, or None. A record an open found only in the checkpoint
        catalog is read from its file now (``StoreCorruptError`` if the file is damaged)."""
        return self._state.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._state

    def __len__(self) -> int:
        return len(self._state)

    def items(self, prefix: str = "") -> Iterator[Record]:
        """Committed records whose key starts with ``prefix`` (unordered)."""
        return self._state.items(prefix)

    def keys(self, prefix: str = "") -> list[str]:
        """Keys of the committed records under ``prefix``; no record file is read."""
        return self._state.keys(prefix)

    def referenced_blobs(self) -> set[str]:
        return self._state.referenced_blobs()

    def watch(
        self, prefix: str, fn: Watcher, summarizer: Summarizer | None = None
    ) -> list[tuple[str, bytes]]:
        """Call ``fn(key, old, new)`` for every committed change under ``prefix``; existing
        records first as ``(key, None, record)``, except those the catalog summarized under
        ``summarizer``'s tag: returned as ``(key, summary)``, unread (see :class:`Summarizer`)."""
        return self._state.watch(prefix, fn, summarizer)

    # -- writing -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("store is closed")

    def _prepare(
        self, mutations: Sequence[Mutation], expect: Mapping[str, int | None] | None
    ) -> tuple[tuple[Op, ...], bytes]:
        """Validate ``mutations``; return their ops and the encoded transaction."""
        self._check_open()
        self.root.check_writable()
        return build_transaction(mutations, expect, self.latest_version, self.options)

    def latest_version(self, key: str) -> int | None:
        """The version (lsn) of ``key`` including commits still in flight; None if absent."""
        pending = self._inflight.get(key)
        if pending is not None:
            return pending[0] if pending[1] else None
        return self._state.version(key)

    async def transact(
        self, mutations: Sequence[Mutation], *, expect: Mapping[str, int | None] | None = None
    ) -> int:
        """Commit ``mutations`` atomically; return the lsn once it is durable.

        ``expect`` maps keys to the version the caller read (None: must be absent); a
        mismatch raises :class:`VersionConflict` before anything is written.
        """
        await self._gate.acquire()  # a checkpoint's drain and roll briefly hold commits
        self._gate.release()
        return await self.reserve(mutations, expect=expect).wait()

    def reserve(
        self, mutations: Sequence[Mutation], *, expect: Mapping[str, int | None] | None = None
    ) -> PendingCommit:
        """Queue a transaction without awaiting: its lsn is assigned now, and later
        expectations see it as in flight. ``await pending.wait()`` makes it durable.

        Lets a caller hold its own lock only while it decides what to write, and wait for the
        fsync outside it, so concurrent writers of one logical sequence share a group commit.
        """
        ops, data = self._prepare(mutations, expect)
        lsn, batch = self._wal.reserve(data)
        self._unapplied.append((lsn, ops))
        for op in ops:
            self._inflight[op.key] = (lsn, op.value is not None)
        return PendingCommit(self, lsn, batch)

    async def _complete(self, pending: PendingCommit) -> int:
        try:
            await self._wal.wait(pending.batch)
        finally:
            self._apply_durable()
        if self.options.auto_checkpoint and self._wal.needs_checkpoint:
            await deferred_if_full_async(self._auto_checkpoint, self.root)
        return pending.lsn

    def transact_sync(
        self, mutations: Sequence[Mutation], *, expect: Mapping[str, int | None] | None = None
    ) -> int:
        """Synchronous commit for single-threaded callers (tools, migrations, simulators)."""
        ops, data = self._prepare(mutations, expect)
        lsn = self._wal.append_sync(data)
        self._durable_lsn = lsn
        self._state.apply(lsn, ops)
        if self.options.auto_checkpoint and self._wal.needs_checkpoint:
            deferred_if_full(self.checkpoint_sync, self.root)
        return lsn

    def _apply_durable(self) -> None:
        if self.root.failed is None:
            self._durable_lsn = self._wal.durable_lsn
        while self._unapplied and self._unapplied[0][0] <= self._durable_lsn:
            lsn, ops = self._unapplied.popleft()
            self._state.apply(lsn, ops)
            for op in ops:
                if self._inflight.get(op.key, (None,))[0] == lsn:
                    del self._inflight[op.key]

    # -- checkpoint --------------------------------------------------------------------------
    async def checkpoint(self) -> None:
        """Materialize changed records as files, write the manifest, release WAL segments."""
        async with self._checkpoint_lock:
            await self._checkpoint_locked()

    async def _auto_checkpoint(self) -> None:
        # Every committer that found the log full gets here; the first checkpoints and the
        # rest, once they hold the lock, find the log released. Without the re-check each of
        # them ran a checkpoint of its own (a manifest write and a segment roll apiece).
        async with self._checkpoint_lock:
            if self._wal.needs_checkpoint:
                await self._checkpoint_locked()

    async def _checkpoint_locked(self) -> None:
        async with self._gate:
            await self._wal.flush()  # every reserved commit durable, then applied
            self._apply_durable()
            image = self._begin_checkpoint()
        # Commits go on while the snapshot is written: they land in segments from start_seq
        # on, which this checkpoint's manifest keeps for replay.
        try:
            await anyio.to_thread.run_sync(self._write_checkpoint, image)
        except BaseException:
            self._state.dirty.update(image.snapshot)
            raise
        self._wal.retire_before(image.start_seq)

    def checkpoint_sync(self) -> None:
        # Refuse a poisoned store first: commits that failed with it stay queued as unapplied
        # forever, and must not be mistaken for commits still in flight.
        self._check_open()
        self.root.check_writable()
        if self._unapplied:
            raise RuntimeError("checkpoint_sync with asynchronous commits in flight")
        image = self._begin_checkpoint()
        try:
            self._write_checkpoint(image)
        except BaseException:
            self._state.dirty.update(image.snapshot)
            raise
        self._wal.retire_before(image.start_seq)

    def _begin_checkpoint(self) -> CheckpointImage:
        self._check_open()
        self.root.check_writable()
        # A checkpoint rewrites files by path: never into a directory this store does not own.
        self.check_ownership()
        start_seq, lsn = self._wal.roll()
        return CheckpointImage(
            start_seq=start_seq,
            lsn=lsn,
            snapshot=self._state.take_dirty(),
            digest=Digest(self._state.digest.value, self._state.digest.count),
            catalog=self._state.catalog_source(),
        )

    def _write_checkpoint(self, image: CheckpointImage) -> None:
        began = time.perf_counter()
        write_checkpoint(self.root, self._manifests, image, self.options.checkpoint_threads)
        self._checkpoints += 1
        self._last_checkpoint_seconds = time.perf_counter() - began

    def update_manifest_meta(self, meta: Mapping[str, str], *, guard_required: bool | None = None) -> None:
        """Durably replace manifest metadata (used by migration phases)."""
        changes: dict[str, Any] = {"meta": dict(meta)}
        if guard_required is not None:
            changes["guard_required"] = guard_required
        self._manifests.write(**changes)

    # -- lifecycle ---------------------------------------------------------------------------
    def statistics(self) -> StoreStatistics:
        s = self._wal.stats
        return StoreStatistics(
            records=len(self._state),
            dirty=len(self._state.dirty),
            next_lsn=self._wal.next_lsn,
            checkpoints=self._checkpoints,
            last_checkpoint_seconds=self._last_checkpoint_seconds,
            recovery_seconds=self.recovery_seconds,
            replayed_transactions=self.replayed,
            wal_commits=s.commits,
            wal_fsyncs=s.fsyncs,
            wal_bytes=self._wal.log_bytes,
            unread=len(self._state.unread),
        )

    @property
    def wal(self) -> WriteAheadLog:
        return self._wal

    def close(self) -> None:
        """Release the WAL and the ownership lock. Committed state is already durable."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.root.failed is None:
                # The MANIFEST goes by path: only into our own directory. A directory moved
                # away is noticed here too (and marked, see OwnershipLock.check).
                try:
                    self.check_ownership()
                except OwnershipLostError as exc:
                    log.error("store: %s", exc)
            if self.root.failed is None and self._wal.durable_lsn > self.manifest.acked_lsn:
                # A clean stop records how far the log was acknowledged, so that later damage
                # to its last frames is told apart from a torn write.
                try:
                    self._manifests.write()
                except Exception as exc:
                    log.warning("store: could not record the acknowledged lsn at close: %s", exc)
            self._wal.close()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RecordStore {self.root.root} records={len(self._state)} lsn={self._wal.next_lsn - 1}>"

"""The ``per-record-v4`` record store: WAL commits, per-record files, in-memory state.

Layout of a state directory (all directories 0700, files 0600)::

    owner.db     SQLite ownership lock (held for the process lifetime)
    secret       32 random bytes; every token is derived from it
    MANIFEST     JSON: checkpoint lsn, where the live WAL chain starts, generation id
    wal/         preallocated segments (see afterword.wal)
    records/     one file per record, named by the hex of its key

Every mutation is a transaction committed to the WAL; the in-memory state changes only after
the fdatasync that covers it. A checkpoint writes the records changed since the previous one
as files (atomic replace, one directory fsync per batch), then a new manifest, and only then
releases the WAL segments it covered. Replay applies an after-image only when its lsn is
newer than the record's, so replaying a transaction twice equals replaying it once.
"""

from __future__ import annotations

import logging
import secrets as _secrets
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from ..disk import Disk, StateRoot, UnsafeStateError, storage_errno
from ..wal import NamedSegment, WalOptions, WriteAheadLog
from ..wal.frame import SEGMENT_MAGIC
from ..wal.reader import read_segment_images
from .codec import (
    FORMAT,
    Manifest,
    Op,
    RecordImage,
    SegmentRef,
    check_key,
    decode_tx,
    encode_manifest,
    encode_record,
    encode_tx,
    record_file_name,
)
from .errors import RecordTooLarge, StoreClosedError, StoreCorruptError, VersionConflict
from .evidence import Digest, EvidenceError, ReplayCheck, check_secret, secret_check
from .loading import (
    MANIFEST,
    RECORDS,
    SECRET,
    SECRET_BYTES,
    WAL_DIR,
    load_record_files,
    read_manifest,
    read_secret,
    record_names,
)
from .lock import OwnershipLock

log = logging.getLogger("afterword.store")
MAX_RECORD_BYTES = 2 * 1024 * 1024

Record = RecordImage
"""A committed record: ``key``, ``lsn`` (its version), ``value`` bytes, ``blobs`` it references."""

Watcher = Callable[[str, Record | None, Record | None], None]


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    blobs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Delete:
    key: str


Mutation = Put | Delete


@dataclass(frozen=True)
class TransactionInfo:
    """What :attr:`StoreOptions.observe_transaction` is told about one transaction."""

    ops: tuple[Op, ...]  # the after-images: key, value (None: a delete), blobs referenced
    payload_bytes: int  # the encoded transaction: what the WAL frames (``max_payload`` bounds it)

    @property
    def largest_value(self) -> int:
        """The largest record value put (``max_record_bytes`` bounds it)."""
        return max((len(op.value) for op in self.ops if op.value is not None), default=0)


@dataclass(frozen=True)
class StoreOptions:
    """``observe_transaction`` is a test hook (never set in production): it is called with
    every transaction the store is asked to commit, before the store checks its limits and
    before anything is written (after the version checks, so a transaction it sees is one
    the store would write unless it is too large). An exception it raises refuses the
    transaction (nothing is written, the caller gets the exception), which lets a test cut a
    service at any commit point, follow every record it writes, and check that no
    transaction exceeds the limits."""

    wal: WalOptions = field(default_factory=WalOptions)
    max_record_bytes: int = MAX_RECORD_BYTES
    checkpoint_threads: int = 8
    auto_checkpoint: bool = True
    observe_transaction: Callable[[TransactionInfo], None] | None = None


@dataclass
class StoreStatistics:
    records: int
    dirty: int
    next_lsn: int
    checkpoints: int
    last_checkpoint_seconds: float
    recovery_seconds: float
    replayed_transactions: int
    wal_commits: int
    wal_fsyncs: int
    wal_bytes: int


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
        self.manifest: Manifest
        self._lock: OwnershipLock | None = None
        self._wal: WriteAheadLog
        self._records: dict[str, Record] = {}
        self._dirty: set[str] = set()
        self._inflight: dict[str, tuple[int, bool]] = {}  # key -> (lsn, exists) not yet durable
        self._unapplied: deque[tuple[int, tuple[Op, ...]]] = deque()
        self._durable_lsn = 0
        self._blob_refs: Counter[str] = Counter()
        self._watchers: list[tuple[str, Watcher]] = []
        self._closed = False
        self._checkpoint_lock = anyio.Lock()  # one checkpoint at a time
        self._manifest_lock = threading.Lock()  # MANIFEST writers: checkpoint, new segment, meta
        self._digest = Digest()  # of the records in memory, kept by _apply
        self._checkpoint_digest = Digest()
        self._gate = anyio.Lock()  # held only while a checkpoint drains the log and rolls it
        self._checkpoints = 0
        self._last_checkpoint_seconds = 0.0
        self.recovery_seconds = 0.0
        self.replayed = 0

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def open(
        cls, path: str, *, disk: Disk | None = None, options: StoreOptions | None = None
    ) -> RecordStore:
        """Lock, validate, load and recover the store at ``path`` (created if absent)."""
        began = time.perf_counter()
        self = cls()
        self.options = options or StoreOptions()
        self.root = StateRoot(path, disk)
        self._lock = OwnershipLock.acquire(self.root)
        try:
            self._recover()
        except BaseException:
            if hasattr(self, "_wal"):
                self._wal.close()
            self._lock.release()
            raise
        self.recovery_seconds = time.perf_counter() - began
        return self

    def _recover(self) -> None:
        root = self.root
        root.remove_temporaries("")
        manifest = read_manifest(root)
        secret = read_secret(root)
        if manifest is None:
            if root.exists(RECORDS) and root.listdir(RECORDS):
                raise StoreCorruptError(f"{root.root}: record files without a MANIFEST")
            if any(img.data[:8] == SEGMENT_MAGIC for img in read_segment_images(root, WAL_DIR)):
                # The first open writes MANIFEST before the log's first segment.
                raise EvidenceError(root.path(MANIFEST), "manifest_missing", "the log holds segments")
            if secret is None:
                root.write_atomic(SECRET, _secrets.token_bytes(SECRET_BYTES))
                secret = read_secret(root)
            assert secret is not None
            self.secret = secret
            self.manifest = Manifest(
                generation=self._generation(0),
                checkpoint_lsn=0,
                wal_start_seq=1,
                record_count=0,
                record_digest=Digest().text(),
                secret_check=secret_check(secret),
            )
            root.ensure_dir(RECORDS)
            root.write_atomic(MANIFEST, encode_manifest(self.manifest))
        else:
            # The secret was durable before the first MANIFEST: state without it is damage.
            check_secret(root.path(SECRET), secret, manifest.secret_check)
            assert secret is not None
            self.secret, self.manifest = secret, manifest
        if not root.exists(RECORDS):
            raise UnsafeStateError(root.path(RECORDS), "missing")
        self._load_records()
        self._digest = Digest.of((key, rec.lsn) for key, rec in self._records.items())
        check = ReplayCheck(
            records_path=root.path(RECORDS),
            checkpoint_lsn=self.manifest.checkpoint_lsn,
            digest=self.manifest.record_digest,
            count=self.manifest.record_count,
            loaded={key: rec.lsn for key, rec in self._records.items()},
        )
        self._wal, frames = WriteAheadLog.open(
            root,
            rel_dir=WAL_DIR,
            start_seq=self.manifest.wal_start_seq,
            checkpoint_lsn=self.manifest.checkpoint_lsn,
            options=self.options.wal,
            named=[NamedSegment(r.slot, r.seq, int(r.salt, 16), r.first_lsn, r.size) for r in self.manifest.segments],
            acked_lsn=self.manifest.acked_lsn,
            before_free=self._forget_segments,
        )
        for frame in frames:
            ops = decode_tx(frame.payload).ops
            for op in ops:
                check.op(frame.lsn, op.key, op.value is not None, op.prior)
            self._apply(frame.lsn, ops)
        check.finish(self._digest)
        self.replayed = len(frames)
        self._durable_lsn = self._wal.next_lsn - 1
        self._wal.on_segment_start = self._name_new_segment
        self._wal.on_rollback = self._void_from
        if self.manifest.format != FORMAT:
            log.warning("store: upgrading %s from %s to %s", root.root, self.manifest.format, FORMAT)
            self.checkpoint_sync()

    # -- MANIFEST ----------------------------------------------------------------------------
    def _write_manifest(self, **changes: Any) -> None:
        """Write a MANIFEST with ``changes`` over the current one (any thread)."""
        with self._manifest_lock:
            base = self.manifest
            fields: dict[str, Any] = {
                "format": FORMAT,
                "acked_lsn": max(base.acked_lsn, self._wal.durable_lsn) if hasattr(self, "_wal") else base.acked_lsn,
                "secret_check": secret_check(self.secret),
            }
            fields.update(changes)
            start = fields.get("wal_start_seq", base.wal_start_seq)
            if "segments" not in changes and hasattr(self, "_wal"):
                fields["segments"] = tuple(
                    SegmentRef(slot=r.slot, seq=r.seq, salt=f"{r.salt:016x}", first_lsn=r.first_lsn, size=r.size)
                    for r in self._wal.live_segments(start)
                )
            fields["generation"] = self._generation(fields.get("checkpoint_lsn", base.checkpoint_lsn))
            manifest = msgspec.structs.replace(base, **fields)
            self.root.write_atomic(MANIFEST, encode_manifest(manifest))
            self.manifest = manifest

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
        root (a write or fsync failed midway) needs a restart.
        """
        failed = self.root.failed
        if failed is not None:
            return ("storage_full" if storage_errno(failed) else "disk_failed", str(failed))
        if self.root.full is not None:
            return "storage_full", str(self.root.full)
        return None

    def _name_new_segment(self) -> None:
        # In the WAL's writing thread: the new life's header is durable; name it before any
        # frame is written into it.
        self._write_manifest()

    def _forget_segments(self, slots: list[int]) -> None:
        keep = tuple(ref for ref in self.manifest.segments if ref.slot not in slots)
        self._write_manifest(segments=keep)

    def _load_records(self) -> None:
        # One listing serves both the temporary cleanup and the load (the directory can hold
        # tens of thousands of names; listing it is a visible part of the open).
        names, temporaries = record_names(self.root)
        for name in temporaries:
            self.root.remove(f"{RECORDS}/{name}", sync_dir=False)
        if temporaries:
            self.root.sync_dir(RECORDS)
        self._records = load_record_files(self.root, self.options.max_record_bytes, names)
        for image in self._records.values():
            if image.blobs:  # Counter.update costs an ABC check even for an empty tuple
                self._blob_refs.update(image.blobs)

    @staticmethod
    def _generation(lsn: int) -> str:
        return f"{lsn:016x}-{_secrets.token_hex(8)}"

    # -- reading -----------------------------------------------------------------------------
    def get(self, key: str) -> Record | None:
        return self._records.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def items(self, prefix: str = "") -> Iterator[Record]:
        """Committed records whose key starts with ``prefix`` (unordered)."""
        for key, rec in list(self._records.items()):
            if key.startswith(prefix):
                yield rec

    def referenced_blobs(self) -> set[str]:
        return {d for d, n in self._blob_refs.items() if n > 0}

    def watch(self, prefix: str, fn: Watcher) -> None:
        """Call ``fn(key, old, new)`` for every committed change under ``prefix``.

        Existing records are reported first as ``(key, None, record)``.
        """
        self._watchers.append((prefix, fn))
        for rec in self.items(prefix):
            fn(rec.key, None, rec)

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
        ops: list[Op] = []
        seen: set[str] = set()
        for m in mutations:
            check_key(m.key)
            if m.key in seen:
                raise ValueError(f"key {m.key!r} appears twice in one transaction")
            seen.add(m.key)
            if isinstance(m, Put):
                ops.append(Op(m.key, m.value, tuple(m.blobs), self.latest_version(m.key) or 0))
            else:
                ops.append(Op(m.key, None, (), self.latest_version(m.key) or 0))
        for key, expected in (expect or {}).items():
            actual = self.latest_version(key)
            if actual != expected:
                raise VersionConflict(key, expected, actual)
        frozen = tuple(ops)
        data = encode_tx(frozen)
        observe = self.options.observe_transaction
        if observe is not None:
            observe(TransactionInfo(frozen, len(data)))
        for op in ops:
            if op.value is not None and len(op.value) > self.options.max_record_bytes:
                raise RecordTooLarge(
                    f"record {op.key!r}: {len(op.value)} bytes exceeds {self.options.max_record_bytes}"
                )
        return frozen, data

    def latest_version(self, key: str) -> int | None:
        """The version (lsn) of ``key`` including commits still in flight; None if absent."""
        pending = self._inflight.get(key)
        if pending is not None:
            return pending[0] if pending[1] else None
        rec = self._records.get(key)
        return rec.lsn if rec is not None else None

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
            await self._auto_checkpoint()
        return pending.lsn

    def transact_sync(
        self, mutations: Sequence[Mutation], *, expect: Mapping[str, int | None] | None = None
    ) -> int:
        """Synchronous commit for single-threaded callers (tools, migrations, simulators)."""
        ops, data = self._prepare(mutations, expect)
        lsn = self._wal.append_sync(data)
        self._durable_lsn = lsn
        self._apply(lsn, ops)
        if self.options.auto_checkpoint and self._wal.needs_checkpoint:
            self.checkpoint_sync()
        return lsn

    def _apply_durable(self) -> None:
        if self.root.failed is None:
            self._durable_lsn = self._wal.durable_lsn
        while self._unapplied and self._unapplied[0][0] <= self._durable_lsn:
            lsn, ops = self._unapplied.popleft()
            self._apply(lsn, ops)
            for op in ops:
                if self._inflight.get(op.key, (None,))[0] == lsn:
                    del self._inflight[op.key]

    def _apply(self, lsn: int, ops: Iterable[Op]) -> None:
        for op in ops:
            old = self._records.get(op.key)
            if old is not None and old.lsn >= lsn:
                continue  # replay of an older after-image: idempotent skip
            if op.value is None:
                if old is None:
                    self._dirty.add(op.key)
                    continue
                del self._records[op.key]
                new = None
            else:
                new = RecordImage(op.key, lsn, op.value, op.blobs)
                self._records[op.key] = new
                self._digest.add(op.key, lsn)
                if new.blobs:
                    self._blob_refs.update(new.blobs)
            if old is not None:
                self._digest.remove(old.key, old.lsn)
            # Guarded: on replay this runs per transaction, and Counter.update/subtract cost an
            # ABC isinstance check even for the empty tuple most records carry (~12% of replay).
            if old is not None and old.blobs:
                self._blob_refs.subtract(old.blobs)
                for d in old.blobs:
                    if self._blob_refs[d] <= 0:
                        del self._blob_refs[d]
            self._dirty.add(op.key)
            for prefix, fn in self._watchers:
                if op.key.startswith(prefix):
                    try:
                        fn(op.key, old, new)
                    except Exception as exc:
                        # The commit is durable and memory matches the log; a broken index is
                        # the watcher's fault and must not hide the commit from its caller.
                        log.error("store watcher for %r failed on %r: %s", prefix, op.key, type(exc).__name__)

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
            start_seq, lsn, snapshot = self._begin_checkpoint()
        # Commits go on while the snapshot is written: they land in segments from start_seq
        # on, which this checkpoint's manifest keeps for replay.
        try:
            await anyio.to_thread.run_sync(self._write_checkpoint, start_seq, lsn, snapshot)
        except BaseException:
            self._dirty.update(snapshot)
            raise
        self._wal.retire_before(start_seq)

    def checkpoint_sync(self) -> None:
        # Refuse a poisoned store first: commits that failed with it stay queued as unapplied
        # forever, and must not be mistaken for commits still in flight.
        self._check_open()
        self.root.check_writable()
        if self._unapplied:
            raise RuntimeError("checkpoint_sync with asynchronous commits in flight")
        start_seq, lsn, snapshot = self._begin_checkpoint()
        try:
            self._write_checkpoint(start_seq, lsn, snapshot)
        except BaseException:
            self._dirty.update(snapshot)
            raise
        self._wal.retire_before(start_seq)

    def _begin_checkpoint(self) -> tuple[int, int, dict[str, Record | None]]:
        self._check_open()
        self.root.check_writable()
        start_seq, lsn = self._wal.roll()
        snapshot = {key: self._records.get(key) for key in self._dirty}
        self._dirty = set()
        self._checkpoint_digest = Digest(self._digest.value, self._digest.count)
        return start_seq, lsn, snapshot

    def _write_checkpoint(self, start_seq: int, lsn: int, snapshot: dict[str, Record | None]) -> None:
        digest = self._checkpoint_digest
        began = time.perf_counter()
        root = self.root
        writes = [(key, rec) for key, rec in snapshot.items() if rec is not None]
        removes = [key for key, rec in snapshot.items() if rec is None]

        def put(item: tuple[str, Record]) -> None:
            key, rec = item
            root.write_atomic(f"{RECORDS}/{record_file_name(key)}", encode_record(rec), sync_dir=False)

        if writes:
            workers = max(1, min(self.options.checkpoint_threads, len(writes)))
            if workers == 1:
                for item in writes:
                    put(item)
            else:
                with ThreadPoolExecutor(workers) as pool:
                    list(pool.map(put, writes))
        for key in removes:
            root.remove(f"{RECORDS}/{record_file_name(key)}", sync_dir=False)
        if snapshot:
            root.sync_dir(RECORDS)
        self._write_manifest(
            checkpoint_lsn=lsn, wal_start_seq=start_seq, record_count=digest.count, record_digest=digest.text()
        )
        self._checkpoints += 1
        self._last_checkpoint_seconds = time.perf_counter() - began

    def update_manifest_meta(self, meta: Mapping[str, str], *, guard_required: bool | None = None) -> None:
        """Durably replace manifest metadata (used by migration phases)."""
        changes: dict[str, Any] = {"meta": dict(meta)}
        if guard_required is not None:
            changes["guard_required"] = guard_required
        self._write_manifest(**changes)

    # -- lifecycle ---------------------------------------------------------------------------
    def statistics(self) -> StoreStatistics:
        s = self._wal.stats
        return StoreStatistics(
            records=len(self._records),
            dirty=len(self._dirty),
            next_lsn=self._wal.next_lsn,
            checkpoints=self._checkpoints,
            last_checkpoint_seconds=self._last_checkpoint_seconds,
            recovery_seconds=self.recovery_seconds,
            replayed_transactions=self.replayed,
            wal_commits=s.commits,
            wal_fsyncs=s.fsyncs,
            wal_bytes=self._wal.log_bytes,
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
            if self.root.failed is None and self._wal.durable_lsn > self.manifest.acked_lsn:
                # A clean stop records how far the log was acknowledged, so that later damage
                # to its last frames is told apart from a torn write.
                try:
                    self._write_manifest()
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
        return f"<RecordStore {self.root.root} records={len(self._records)} lsn={self._wal.next_lsn - 1}>"




"""A read-only view of a state directory: no lock, no repair, no checkpoint, no writes.

``open_readonly`` gives operator tools (``afterword tasks list``, ``afterword continuations
doctor``) the committed records of a state directory, also while the host that owns it is
running. It runs the same fail-closed checks as :meth:`RecordStore.open` (file rules, record
and MANIFEST decoding, WAL chain rules, the evidence of loss), but never changes a byte: a
torn or not yet durable tail of the log is left out instead of cut, temporaries are ignored
instead of deleted, and nothing is created.

Reading beside a live writer races with its checkpoints (records rewritten, MANIFEST
replaced, segments reused) and its group commits; an inconsistent read is retried a few
times and only damage that persists is reported.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..disk import Disk, DiskError, StateRoot, UnsafeStateError
from ..wal import NamedSegment, WalError
from ..wal.reader import read_chain
from .codec import Manifest, RecordImage
from .errors import StoreError
from .evidence import ReplayCheck, check_secret
from .loading import (
    MANIFEST,
    RECORDS,
    SECRET,
    WAL_DIR,
    check_guard_file,
    load_record_files,
    read_high_water,
    read_manifest,
    read_secret,
)
from .memory import CommittedState
from .store import StoreOptions
from .usage import refuse_if_used

Record = RecordImage


@dataclass(frozen=True)
class StoreView:
    """Committed records of a state directory as of one consistent read.

    Read API compatible with :class:`RecordStore`: ``get``, ``items``, ``latest_version``,
    ``len()``, ``in``, ``referenced_blobs``; plus ``manifest``, ``secret`` (``None`` while no
    secret exists yet), ``lsn`` (the last transaction shown) and ``root`` (for blob reads).
    """

    root: StateRoot
    manifest: Manifest
    secret: bytes | None
    lsn: int
    records: dict[str, Record]

    def get(self, key: str) -> Record | None:
        return self.records.get(key)

    def latest_version(self, key: str) -> int | None:
        rec = self.records.get(key)
        return rec.lsn if rec is not None else None

    def __contains__(self, key: object) -> bool:
        return key in self.records

    def __len__(self) -> int:
        return len(self.records)

    def items(self, prefix: str = "") -> Iterator[Record]:
        """Records whose key starts with ``prefix`` (unordered)."""
        for key, rec in self.records.items():
            if key.startswith(prefix):
                yield rec

    def referenced_blobs(self) -> set[str]:
        return {d for rec in self.records.values() for d in rec.blobs}

    def close(self) -> None:
        """Nothing to release (kept so callers can treat a view like a store)."""

    def __enter__(self) -> StoreView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_readonly(
    path: str,
    *,
    disk: Disk | None = None,
    options: StoreOptions | None = None,
    attempts: int = 4,
) -> StoreView:
    """Read the committed state at ``path`` without locking or changing it.

    Raises ``UnsafeStateError`` (``missing`` when ``path`` is not a state directory) and
    ``StoreCorruptError``/``WalCorruptError`` on damage, like :meth:`RecordStore.open`; an
    empty state directory (no MANIFEST, no records) reads as empty. Safe to call while
    another process owns the directory: reads that a concurrent checkpoint or commit made
    inconsistent are retried up to ``attempts`` times.
    """
    options = options or StoreOptions()
    root = StateRoot(os.path.abspath(path), disk, create=False)
    for attempt in range(attempts):
        before = _manifest_bytes(root)
        try:
            return _read(root, options)
        except (StoreError, WalError, DiskError):
            # Damage persists across re-reads; a live writer's changes do not. Retry when the
            # MANIFEST moved under us or while attempts remain (a commit racing our reads).
            if attempt + 1 >= attempts:
                raise
            if _manifest_bytes(root) == before:
                time.sleep(0.02 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


def _manifest_bytes(root: StateRoot) -> bytes | None:
    try:
        return root.read_file(MANIFEST, max_size=1024 * 1024)
    except (DiskError, OSError):
        return None


def _read(root: StateRoot, options: StoreOptions) -> StoreView:
    check_guard_file(root)
    secret = read_secret(root)
    manifest = read_manifest(root)
    if manifest is not None:
        check_secret(root.path(SECRET), secret, manifest.secret_check)
    if manifest is None:
        refuse_if_used(root)
        manifest = Manifest(generation="", checkpoint_lsn=0, wal_start_seq=1, record_count=0)
        records: dict[str, Record] = {}
        high_water = None
    else:
        if not root.exists(RECORDS):
            raise UnsafeStateError(root.path(RECORDS), "missing")
        records = load_record_files(root, options.max_record_bytes)
        # The mark after the records, as the owner's open reads them (one first rule for
        # doctor and serve), and before the segments: a live owner marks a write only once
        # it is durable, so the segments read next reach the mark.
        high_water = read_high_water(root, manifest)
    frames, _ = read_chain(
        root,
        WAL_DIR,
        start_seq=manifest.wal_start_seq,
        checkpoint_lsn=manifest.checkpoint_lsn,
        max_payload=options.wal.max_payload,
        named=[NamedSegment(r.slot, r.seq, int(r.salt, 16), r.first_lsn, r.size) for r in manifest.segments],
        acked_lsn=manifest.acked_lsn,
        high_water=high_water,
    )
    check = ReplayCheck(
        records_path=root.path(RECORDS),
        checkpoint_lsn=manifest.checkpoint_lsn,
        digest=manifest.record_digest,
        count=manifest.record_count,
        loaded={key: rec.lsn for key, rec in records.items()},
    )
    state = CommittedState()
    state.load(records)
    state.replay(frames, check)  # the open's one replay path
    check.finish(state.digest)
    assert frames.first_lsn == manifest.checkpoint_lsn + 1, "the log continues the checkpoint"
    lsn = frames.first_lsn + len(frames) - 1
    return StoreView(root=root, manifest=manifest, secret=secret, lsn=lsn, records=state.records)

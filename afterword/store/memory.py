"""The committed records in memory, and what follows from them.

``CommittedState`` holds every record as of the last durable commit, the set changed since the
last checkpoint, how many records reference each blob, the running digest of every
``(key, version)`` (the MANIFEST's ``record_digest`` evidence), and the watchers told about
each change. Nothing here does I/O: the store applies a transaction only after the fsync that
covers it, and replay applies the log's transactions through the same :meth:`apply`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator

from .codec import Op, RecordImage
from .evidence import Digest
from .types import Record, Watcher

log = logging.getLogger("afterword.store")


class CommittedState:
    __slots__ = ("blob_refs", "digest", "dirty", "records", "watchers")

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        self.dirty: set[str] = set()
        self.blob_refs: Counter[str] = Counter()
        self.watchers: list[tuple[str, Watcher]] = []
        self.digest = Digest()

    def load(self, records: dict[str, Record]) -> None:
        """Start from the records read at open (before any watcher exists)."""
        self.records = records
        for image in records.values():
            if image.blobs:  # Counter.update costs an ABC check even for an empty tuple
                self.blob_refs.update(image.blobs)
        self.digest = Digest.of((key, rec.lsn) for key, rec in records.items())

    # -- reading -------------------------------------------------------------------------------
    def get(self, key: str) -> Record | None:
        return self.records.get(key)

    def version(self, key: str) -> int | None:
        rec = self.records.get(key)
        return rec.lsn if rec is not None else None

    def __contains__(self, key: object) -> bool:
        return key in self.records

    def __len__(self) -> int:
        return len(self.records)

    def items(self, prefix: str = "") -> Iterator[Record]:
        for key, rec in list(self.records.items()):
            if key.startswith(prefix):
                yield rec

    def referenced_blobs(self) -> set[str]:
        return {d for d, n in self.blob_refs.items() if n > 0}

    def watch(self, prefix: str, fn: Watcher) -> None:
        self.watchers.append((prefix, fn))
        for rec in self.items(prefix):
            fn(rec.key, None, rec)

    # -- changing ------------------------------------------------------------------------------
    def apply(self, lsn: int, ops: Iterable[Op]) -> None:
        """Apply one durable transaction's after-images (idempotent under replay)."""
        for op in ops:
            old = self.records.get(op.key)
            if old is not None and old.lsn >= lsn:
                continue  # replay of an older after-image: idempotent skip
            if op.value is None:
                if old is None:
                    self.dirty.add(op.key)
                    continue
                del self.records[op.key]
                new = None
            else:
                new = RecordImage(op.key, lsn, op.value, op.blobs)
                self.records[op.key] = new
                self.digest.add(op.key, lsn)
                if new.blobs:
                    self.blob_refs.update(new.blobs)
            if old is not None:
                self.digest.remove(old.key, old.lsn)
            # Guarded: on replay this runs per transaction, and Counter.update/subtract cost an
            # ABC isinstance check even for the empty tuple most records carry (~12% of replay).
            if old is not None and old.blobs:
                self.blob_refs.subtract(old.blobs)
                for d in old.blobs:
                    if self.blob_refs[d] <= 0:
                        del self.blob_refs[d]
            self.dirty.add(op.key)
            self._notify(op.key, old, new)

    def _notify(self, key: str, old: Record | None, new: Record | None) -> None:
        for prefix, fn in self.watchers:
            if key.startswith(prefix):
                try:
                    fn(key, old, new)
                except Exception as exc:
                    # The commit is durable and memory matches the log; a broken index is
                    # the watcher's fault and must not hide the commit from its caller.
                    log.error("store watcher for %r failed on %r: %s", prefix, key, type(exc).__name__)

    def take_dirty(self) -> dict[str, Record | None]:
        """The records changed since the last checkpoint (None: deleted), now marked clean."""
        snapshot = {key: self.records.get(key) for key in self.dirty}
        self.dirty = set()
        return snapshot

"""The committed records in memory, and what follows from them.

``CommittedState`` holds every record as of the last durable commit, the set changed since the
last checkpoint, how many records reference each blob, the running digest of every
``(key, version)`` (the MANIFEST's ``record_digest`` evidence), and the watchers told about
each change. The store applies a transaction only after the fsync that covers it
(:meth:`apply`); an open replays the log once (:meth:`replay`), before any watcher exists.

Records an open found in the checkpoint catalog start *unread*: their key, version and blob
references are known, their bytes stay in their record file until a read asks for them
(through ``reader``, the only I/O here). A watcher reads every record under its prefix when it
is registered, so a record still unread is one no watcher follows, unless the watcher gave a
:class:`Summarizer`: then a catalogued record whose summary was made under the same tag is
handed over as ``(key, summary)`` and stays unread.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from ..wal.layout import Frame
from ..wal.log_frames import LogFrames
from .catalog import CatalogEntry, CatalogSource
from .codec import Op, RecordImage
from .evidence import Digest, ReplayCheck
from .replay import replay_last_images
from .types import Record, Summarizer, Watcher

log = logging.getLogger("afterword.store")
Reader = Callable[[list[CatalogEntry]], list[Record]]
_READ_BATCH = 4096  # record files read through one directory descriptor at a time


class CommittedState:
    __slots__ = (
        "blob_refs",
        "digest",
        "dirty",
        "reader",
        "records",
        "summaries",
        "summarizers",
        "tags",
        "unread",
        "watchers",
    )

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        self.unread: dict[str, CatalogEntry] = {}  # in a record file, not read yet
        self.reader: Reader | None = None
        self.dirty: set[str] = set()
        self.blob_refs: Counter[str] = Counter()
        self.watchers: list[tuple[str, Watcher]] = []
        self.digest = Digest()
        self.summarizers: dict[str, Summarizer] = {}  # prefix -> the summarizer a watcher gave
        self.tags: dict[str, str] = {}  # prefix -> tag of the loaded catalog's summaries
        # key -> (version, summary) made at a checkpoint; touched only by the checkpoint writer
        self.summaries: dict[str, tuple[int, bytes]] = {}

    def load(self, records: dict[str, Record]) -> None:
        """Start from the records read at open (before any watcher exists)."""
        self.records = records
        for image in records.values():
            if image.blobs:  # Counter.update costs an ABC check even for an empty tuple
                self.blob_refs.update(image.blobs)
        self.digest = Digest.of((key, rec.lsn) for key, rec in records.items())

    def load_catalog(
        self,
        entries: list[CatalogEntry],
        records: dict[str, Record],
        reader: Reader,
        tags: dict[str, str] | None = None,
    ) -> None:
        """Start from a checkpoint catalog (bytes read later by ``reader``) plus the record
        files found beside it (``records``, read already)."""
        self.load(records)
        self.reader = reader
        self.tags = tags or {}  # prefix -> the tag its entries' summaries were made under
        self.unread = {e.key: e for e in entries}
        self.digest.merge(Digest.of((e.key, e.lsn) for e in entries))
        for e in entries:
            if e.blobs:
                self.blob_refs.update(e.blobs)

    # -- reading -------------------------------------------------------------------------------
    def get(self, key: str) -> Record | None:
        rec = self.records.get(key)
        if rec is None and key in self.unread:
            rec = self._read([self.unread[key]])[0]
        return rec

    def version(self, key: str) -> int | None:
        rec = self.records.get(key)
        if rec is not None:
            return rec.lsn
        entry = self.unread.get(key)
        return entry.lsn if entry is not None else None

    def __contains__(self, key: object) -> bool:
        return key in self.records or key in self.unread

    def __len__(self) -> int:
        return len(self.records) + len(self.unread)

    def items(self, prefix: str = "") -> Iterator[Record]:
        if self.unread:
            wanted = [e for key, e in self.unread.items() if key.startswith(prefix)]
            for i in range(0, len(wanted), _READ_BATCH):
                self._read(wanted[i : i + _READ_BATCH])
        for key, rec in list(self.records.items()):
            if key.startswith(prefix):
                yield rec

    def keys(self, prefix: str = "") -> list[str]:
        return [k for k in (*self.records, *self.unread) if k.startswith(prefix)]

    def _read(self, entries: list[CatalogEntry]) -> list[Record]:
        assert self.reader is not None
        images = self.reader(entries)
        for image in images:
            # A commit may have replaced the record while the files were read.
            if self.unread.pop(image.key, None) is not None:
                self.records[image.key] = image
        return [self.records.get(e.key, image) for e, image in zip(entries, images, strict=True)]

    def referenced_blobs(self) -> set[str]:
        return {d for d, n in self.blob_refs.items() if n > 0}

    def watch(
        self, prefix: str, fn: Watcher, summarizer: Summarizer | None = None
    ) -> list[tuple[str, bytes]]:
        self.watchers.append((prefix, fn))
        summarized: list[tuple[str, bytes]] = []
        if summarizer is not None:
            self.summarizers[prefix] = summarizer
        if self.unread:
            under = [e for key, e in self.unread.items() if key.startswith(prefix)]
            wanted = under
            if summarizer is not None and self.tags.get(prefix) == summarizer.tag:
                summarized = [(e.key, e.summary) for e in under if e.summary]
                wanted = [e for e in under if not e.summary]
            for i in range(0, len(wanted), _READ_BATCH):
                self._read(wanted[i : i + _READ_BATCH])
        for key, rec in list(self.records.items()):
            if key.startswith(prefix):
                fn(key, None, rec)
        return summarized

    # -- changing ------------------------------------------------------------------------------
    def apply(self, lsn: int, ops: Iterable[Op]) -> None:
        """Apply one durable transaction's after-images (idempotent under replay)."""
        for op in ops:
            old = self.records.get(op.key)
            unread = old is None and op.key in self.unread
            if unread and self._forget_unread(op.key, lsn):
                continue
            if old is not None and old.lsn >= lsn:
                continue  # replay of an older after-image: idempotent skip
            if op.value is None:
                if old is None:
                    self.dirty.add(op.key)
                    if unread:  # a summarizing watcher knows this record without its bytes
                        self._notify(op.key, None, None)
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

    def replay(self, frames: LogFrames | Iterable[Frame], check: ReplayCheck) -> None:
        """Apply the log's transactions at open (``frames`` in increasing lsn order, as the
        log gives them), carrying ``check`` along (``replay.py``: one record per key, and
        only the digest terms that do not cancel are hashed).

        Replay runs before anything can watch: a watcher subscribes after it and is told of
        every record then (:meth:`watch`), so no change needs to be told one by one here.
        """
        assert not self.watchers, "watchers subscribe after replay"
        replay_last_images(frames, check, self.records, self.unread, self.dirty, self.blob_refs, self.digest)

    def _forget_unread(self, key: str, lsn: int) -> bool:
        """Drop an unread record that transaction ``lsn`` replaces; True if ``lsn`` is older
        (replay of an after-image the record file already holds: skip the operation)."""
        entry = self.unread.get(key)
        if entry is None:
            return False
        if entry.lsn >= lsn:
            return True
        del self.unread[key]
        self.digest.remove(key, entry.lsn)
        if entry.blobs:
            self.blob_refs.subtract(entry.blobs)
            for d in entry.blobs:
                if self.blob_refs[d] <= 0:
                    del self.blob_refs[d]
        return False

    def _notify(self, key: str, old: Record | None, new: Record | None) -> None:
        for prefix, fn in self.watchers:
            if key.startswith(prefix):
                try:
                    fn(key, old, new)
                except Exception as exc:
                    # The commit is durable and memory matches the log; a broken index is
                    # the watcher's fault and must not hide the commit from its caller.
                    log.error("store watcher for %r failed on %r: %s", prefix, key, type(exc).__name__)

    def catalog_source(self) -> CatalogSource:
        """Copies of what a checkpoint's catalog lists (cheap; encoded off the event loop)."""
        return CatalogSource(
            dict(self.records), dict(self.unread), dict(self.summarizers), self.tags, self.summaries
        )

    def take_dirty(self) -> dict[str, Record | None]:
        """The records changed since the last checkpoint (None: deleted), now marked clean."""
        snapshot = {key: self.records.get(key) for key in self.dirty}
        self.dirty = set()
        return snapshot

"""Writing a checkpoint: each changed record file replaced atomically, each deleted one
unlinked, one directory fsync for the batch, then the catalog of every record (the MANIFEST
that names both is written after them)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..disk import StateRoot
from .catalog import CATALOG, CatalogSource, Entry, catalog_check, encode_catalog
from .codec import encode_record, record_file_name
from .evidence import Digest
from .loading import RECORDS
from .manifest import ManifestKeeper
from .types import Record

log = logging.getLogger("afterword.store")


@dataclass(frozen=True, slots=True)
class CheckpointImage:
    """What one checkpoint writes, taken while commits are held: the records changed since the
    last one, the digest and catalog of the whole committed state at ``lsn``, and the first
    segment the new MANIFEST keeps for replay."""

    start_seq: int
    lsn: int
    snapshot: dict[str, Record | None]
    digest: Digest
    catalog: CatalogSource


def write_checkpoint(
    root: StateRoot, manifests: ManifestKeeper, image: CheckpointImage, threads: int
) -> None:
    """Record files, then the catalog, then the MANIFEST naming both: a crash before the last
    write leaves the previous MANIFEST in force, and the log still covers everything."""
    # The catalog lists every record the digest counts: the MANIFEST's record_count.
    assert len(image.catalog.records) + len(image.catalog.unread) == image.digest.count
    assert not image.catalog.records.keys() & image.catalog.unread.keys(), "a record is read or unread"
    write_record_files(root, image.snapshot, threads)
    catalog = write_catalog(root, image.lsn, image.catalog)
    manifests.write(
        checkpoint_lsn=image.lsn,
        wal_start_seq=image.start_seq,
        record_count=image.digest.count,
        record_digest=image.digest.text(),
        catalog=catalog,
    )


def write_record_files(root: StateRoot, snapshot: dict[str, Record | None], threads: int) -> None:
    """Materialize ``snapshot`` (key -> record, None: deleted) under ``records/``, durably."""
    writes = [(key, rec) for key, rec in snapshot.items() if rec is not None]
    removes = [key for key, rec in snapshot.items() if rec is None]

    def put(item: tuple[str, Record]) -> None:
        key, rec = item
        assert rec.key == key, "a record file is named after its own key"
        root.write_atomic(f"{RECORDS}/{record_file_name(key)}", encode_record(rec), sync_dir=False)

    if writes:
        workers = max(1, min(threads, len(writes)))
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


def catalog_entries(source: CatalogSource) -> tuple[list[Entry], dict[str, str]]:
    """Every record's entry, with the summary of each record under a summarized prefix (made
    once per version; cached), and the tag of each prefix's summaries."""
    tags = {p: t for p, t in source.tags.items() if p not in source.summarizers}
    tags.update((p, s.tag) for p, s in source.summarizers.items())
    cache: dict[str, tuple[int, bytes]] = {}
    entries: list[Entry] = []
    for key, rec in source.records.items():
        for prefix, summarizer in source.summarizers.items():
            if key.startswith(prefix):
                made = source.cache.get(key)
                if made is None or made[0] != rec.lsn:
                    try:
                        made = (rec.lsn, summarizer.summarize(rec.value))
                    except Exception as exc:
                        # The record's watcher already refuses it; the next open reads it and
                        # refuses it there. A checkpoint is never held up by it.
                        log.warning("store: no summary of %r: %s", key, type(exc).__name__)
                        break
                cache[key] = made
                entries.append((key, rec.lsn, rec.blobs, made[1]))
                break
        else:
            entries.append((key, rec.lsn, rec.blobs))
    source.cache.clear()
    source.cache.update(cache)
    entries += [
        (key, e.lsn, e.blobs, e.summary) if e.summary else (key, e.lsn, e.blobs)
        for key, e in source.unread.items()
    ]
    return entries, tags


def write_catalog(root: StateRoot, checkpoint_lsn: int, source: CatalogSource) -> str:
    """Write ``CATALOG`` for the checkpoint at ``checkpoint_lsn`` (atomic replace, durable)
    and return the check the MANIFEST names it by. Runs after the record files are durable
    and before the MANIFEST: a crash in between leaves a MANIFEST naming another catalog,
    and the next open reads the record files instead."""
    entries, tags = catalog_entries(source)
    data = encode_catalog(checkpoint_lsn, entries, tags)
    try:
        root.write_atomic(CATALOG, data)
    except OSError as exc:
        if root.failed is not None:
            raise  # a failed fsync or write: the checkpoint fails as it would anyway
        # The catalog only speeds up the next open: without it the checkpoint stays whole
        # and the MANIFEST names no catalog, so the next open reads every record file.
        log.warning("store: could not write %s (%s); the next open reads every record file", CATALOG, exc)
        return ""
    return catalog_check(data)


# An automatic checkpoint runs after the commit that filled the log is durable. When it fails
# without poisoning the root (no space, a rename or create refused: nothing durable is lost),
# it waits for the next commit instead of failing this one: an error would tell the caller
# "not written" about a written commit. After a failed fsync or write (the root is poisoned)
# the error is raised, so nothing is acknowledged after one.
def deferred_if_full(checkpoint: Callable[[], None], root: StateRoot) -> None:
    try:
        checkpoint()
    except Exception as exc:
        if root.failed is not None:
            raise
        log.warning("store: automatic checkpoint deferred: %s", exc)


async def deferred_if_full_async(checkpoint: Callable[[], Awaitable[None]], root: StateRoot) -> None:
    try:
        await checkpoint()
    except Exception as exc:
        if root.failed is not None:
            raise
        log.warning("store: automatic checkpoint deferred: %s", exc)

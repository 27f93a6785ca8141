"""Writing a checkpoint's record files: each changed record replaced atomically, each deleted
one unlinked, then one directory fsync for the batch (the MANIFEST is written after it)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..disk import StateRoot
from .codec import encode_record, record_file_name
from .loading import RECORDS
from .types import Record


def write_record_files(root: StateRoot, snapshot: dict[str, Record | None], threads: int) -> None:
    """Materialize ``snapshot`` (key -> record, None: deleted) under ``records/``, durably."""
    writes = [(key, rec) for key, rec in snapshot.items() if rec is not None]
    removes = [key for key, rec in snapshot.items() if rec is None]

    def put(item: tuple[str, Record]) -> None:
        key, rec = item
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

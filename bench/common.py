"""Shared pieces of the benchmarks: scratch directories, fixture builders, statistics.

Fixtures (stores with many records, long logs, SQLite files holding the same rows) are built
through :class:`NoSyncDisk`, a disk seam whose syncs do nothing: building them durably would
cost minutes of fsyncs and measure nothing we report. Every measured operation runs on the
real :class:`~afterword.disk.OsDisk`, after :func:`settle` has flushed the fixture to disk.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sqlite3
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from afterword.disk import NoSyncDisk, StateRoot
from afterword.store import Manifest, Put, RecordStore, StoreOptions
from afterword.store.catalog import CATALOG, catalog_check, encode_catalog
from afterword.store.codec import RecordImage, encode_manifest, encode_record, record_file_name
from afterword.store.evidence import Digest
from afterword.store.loading import MANIFEST, RECORDS
from afterword.wal import WalOptions

REPO = Path(__file__).resolve().parent.parent
KiB = 1024
MiB = 1024 * KiB

# A 1 KiB transaction: what one durable transition of a continuation record costs.
PAYLOAD_1K = bytes(range(256)) * 4
ACTIVE_VALUE_BYTES = 1024  # an active continuation record
TOMBSTONE_VALUE_BYTES = 96  # a terminal idempotency tombstone: ids, hashes, state


Size = Callable[[int, int], int]  # the suites' ``size(real, smoke_size)`` fixture
Fresh = Callable[[], str]  # the suites' ``fresh()`` directory factory


class Closable(Protocol):
    def close(self) -> None: ...


def output_path(text: str) -> str:
    """argparse type for --json/--plot: refuse a path whose directory is missing up front,
    instead of failing with a traceback after minutes of measuring."""
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{text}: directory {parent} does not exist")
    return text


def scratch_base(explicit: str | None = None) -> str:
    """Where scratch directories go: on the repository's file system, so figures describe it.

    The system temp directory is used when it lives on the same device as the repository;
    otherwise ``<repo>/.benchmarks/tmp`` (ignored by git).
    """
    if explicit:
        os.makedirs(explicit, mode=0o700, exist_ok=True)
        return explicit
    tmp = tempfile.gettempdir()
    if os.stat(tmp).st_dev == os.stat(REPO).st_dev:
        return tmp
    base = REPO / ".benchmarks" / "tmp"
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    return str(base)


@contextmanager
def scratch_dir(base: str, prefix: str = "afterword-bench-") -> Iterator[str]:
    """A fresh owner-only directory under ``base``, removed afterwards."""
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    os.chmod(path, 0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def settle() -> None:
    """Push fixture bytes to the disk so their writeback does not land inside a measurement."""
    os.sync()


def describe_filesystem(path: str) -> dict[str, str]:
    """Device, mount point, file-system type and options of ``path`` (from /proc/self/mounts)."""
    best: tuple[str, str, str, str] = ("?", "?", "?", "?")
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            for line in fh:
                dev, mnt, fstype, opts = line.split()[:4]
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best[1]):
                    best = (dev, mnt, fstype, opts)
    except OSError:
        pass
    return {"device": best[0], "mount": best[1], "fstype": best[2], "options": best[3]}


# -- fixtures ------------------------------------------------------------------------------------
def active_key(i: int) -> str:
    return f"cont/active/{i:08d}"


def tombstone_key(i: int) -> str:
    return f"cont/tomb/{i:08d}"


def _value(i: int, size: int) -> bytes:
    stamp = i.to_bytes(8, "little")
    return (stamp * (size // 8 + 1))[:size]


def fixture_rows(active: int, tombstones: int) -> Iterator[tuple[str, bytes]]:
    for i in range(active):
        yield active_key(i), _value(i, ACTIVE_VALUE_BYTES)
    for i in range(tombstones):
        yield tombstone_key(i), _value(i, TOMBSTONE_VALUE_BYTES)


def build_checkpointed_store(path: str, active: int, tombstones: int, *, catalog: bool = True) -> None:
    """A closed store whose records all live in record files, as a checkpoint leaves them.

    The store creates its own layout; the record files, the checkpoint catalog and the
    manifest are then written directly with the store's codec (one plain write each), because
    60,000 atomic replaces would cost far longer than the open being measured. With
    ``catalog=False`` the manifest names no catalog, so the open reads every record file (the
    ``per-record-v4`` open).
    """
    with RecordStore.open(path, disk=NoSyncDisk()) as store:
        base = store.manifest
    records = os.path.join(path, RECORDS)
    lsn = 0
    digest = Digest()
    entries: list[tuple[str, int, tuple[str, ...]]] = []
    for lsn, (key, value) in enumerate(fixture_rows(active, tombstones), start=1):
        digest.add(key, lsn)
        entries.append((key, lsn, ()))
        fd = os.open(
            os.path.join(records, record_file_name(key)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
        )
        try:
            os.write(fd, encode_record(RecordImage(key, lsn, value)))
        finally:
            os.close(fd)
    root = StateRoot(path, NoSyncDisk())
    catalog_id = ""
    if catalog:
        data = encode_catalog(lsn, entries)
        root.write_atomic(CATALOG, data)
        catalog_id = catalog_check(data)
    manifest = Manifest(
        generation=f"{lsn:016x}-bench",
        checkpoint_lsn=lsn,
        wal_start_seq=1,
        record_count=lsn,
        acked_lsn=lsn,
        record_digest=digest.text(),
        secret_check=base.secret_check,
        catalog=catalog_id,
    )
    root.write_atomic(MANIFEST, encode_manifest(manifest))


def build_sqlite_rows(path: str, active: int, tombstones: int) -> None:
    """The same rows in an SQLite database (WAL mode), for the open comparison."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE records (key TEXT PRIMARY KEY, lsn INTEGER NOT NULL, value BLOB NOT NULL)")
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO records (key, lsn, value) VALUES (?, ?, ?)",
            ((key, n + 1, value) for n, (key, value) in enumerate(fixture_rows(active, tombstones))),
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def build_sqlite_from_store(store_path: str, path: str) -> None:
    """An SQLite database (WAL mode) holding every record of a closed store as rows, and
    beside them the tombstones' summaries (table ``summaries``), as a service on SQLite would
    keep the index it reads at start."""
    from afterword.app.repository import TOMB
    from afterword.app.tombstones import SUMMARIZER

    with RecordStore.open(store_path, disk=NoSyncDisk()) as store:
        rows = [(rec.key, rec.lsn, rec.value) for rec in store.items()]
    summaries = [(key, SUMMARIZER.summarize(value)) for key, _, value in rows if key.startswith(TOMB)]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE records (key TEXT PRIMARY KEY, lsn INTEGER NOT NULL, value BLOB NOT NULL)")
        conn.execute("CREATE TABLE summaries (key TEXT PRIMARY KEY, summary BLOB NOT NULL)")
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO records (key, lsn, value) VALUES (?, ?, ?)", rows)
        conn.executemany("INSERT INTO summaries (key, summary) VALUES (?, ?)", summaries)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def log_options(log_mib: int) -> StoreOptions:
    """Store options under which a ``log_mib`` log is kept whole (no checkpoint)."""
    return StoreOptions(wal=WalOptions(max_log_bytes=(log_mib + 64) * MiB), auto_checkpoint=False)


def build_logged_store(path: str, log_mib: int, keys: int = 10_000) -> int:
    """A closed store whose state is a ``log_mib`` MiB log of 1 KiB transactions; returns their count.

    Transactions cycle over ``keys`` keys, so replay applies many overwrites, as a live log does.
    """
    store = RecordStore.open(path, disk=NoSyncDisk(), options=log_options(log_mib))
    n = 0
    try:
        target = log_mib * MiB
        while store.wal.stats.frame_bytes < target:  # the log's frames (shadows not counted)
            store.transact_sync([Put(f"cont/active/{n % keys:08d}", PAYLOAD_1K)])
            n += 1
    finally:
        store.close()
    return n


# -- statistics ----------------------------------------------------------------------------------
def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (``q`` in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values), max(1, math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def median_seconds(benchmark: object) -> float | None:
    """A pytest-benchmark fixture's median round time; None when benchmarks are disabled."""
    stats = getattr(benchmark, "stats", None)
    return None if stats is None else float(stats.stats.median)

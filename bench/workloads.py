"""The measured workloads, each a function of a fresh scratch directory returning a :class:`Sample`.

Commit workloads run for a fixed window of wall time and count 1 KiB transactions made
durable in it; open workloads time one open of a prebuilt fixture. ``python -m bench.compare``
and the pytest-benchmark suites both call these, so the two always measure the same thing.
"""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from afterword.app.repository import LIVE, TOMB, Repository
from afterword.app.tombstones import SUMMARIZER
from afterword.disk import Disk, OsDisk, StateRoot
from afterword.store import Put, RecordStore, StoreOptions
from afterword.store.codec import RecordImage
from afterword.wal import WalOptions, WriteAheadLog
from afterword.wal.highwater import HighWater

from .common import PAYLOAD_1K, MiB, log_options

LIMIT_FILE_BYTES = 16 * MiB
KEYSPACE = 1024  # keys the record workloads cycle over: updates, as a live service makes
BUSY_TIMEOUT_MS = 30_000
# Bytes/s the fastest configuration has been seen to log here, used only to size the pool of
# zero-filled segments made ready before a window (a larger pool costs setup time, not results).
_LOG_RATE_ESTIMATE = 48 * MiB


@dataclass
class Sample:
    """``ops`` operations in ``seconds``; ``latencies`` (seconds) when taken per operation."""

    ops: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    nbytes: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


# -- the physical limit --------------------------------------------------------------------------
def _timed_loop(step: Callable[[int], None], seconds: float) -> Sample:
    latencies: list[float] = []
    clock = time.perf_counter
    began = clock()
    deadline = began + seconds
    n = 0
    now = began
    while now < deadline:
        step(n)
        after = clock()
        latencies.append(after - now)
        now = after
        n += 1
    return Sample(n, now - began, latencies)


def limit_prealloc(workdir: str, seconds: float) -> Sample:
    """pwrite 1 KiB + fdatasync into a file whose blocks were written (zeros) and synced first."""
    path = os.path.join(workdir, "prealloc.dat")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        zeros = bytes(MiB)
        for off in range(0, LIMIT_FILE_BYTES, MiB):
            os.pwrite(fd, zeros, off)
        os.fsync(fd)
        slots = LIMIT_FILE_BYTES // len(PAYLOAD_1K)

        def step(n: int) -> None:
            os.pwrite(fd, PAYLOAD_1K, (n % slots) * len(PAYLOAD_1K))
            os.fdatasync(fd)

        return _timed_loop(step, seconds)
    finally:
        os.close(fd)


def limit_append(workdir: str, seconds: float) -> Sample:
    """Append 1 KiB + fdatasync to a growing file (each sync also commits the new size)."""
    fd = os.open(os.path.join(workdir, "append.dat"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:

        def step(n: int) -> None:
            os.write(fd, PAYLOAD_1K)
            os.fdatasync(fd)

        return _timed_loop(step, seconds)
    finally:
        os.close(fd)


def limit_rename(workdir: str, seconds: float) -> Sample:
    """Per record: temp file, write 1 KiB, fsync, rename over the record, fsync the directory."""
    dfd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    temp = os.path.join(workdir, ".record.tmp")
    final = os.path.join(workdir, "record")
    try:

        def step(n: int) -> None:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, PAYLOAD_1K)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, final)
            os.fsync(dfd)

        return _timed_loop(step, seconds)
    finally:
        os.close(dfd)


# -- afterword -----------------------------------------------------------------------------------
async def _drive(commit: Callable[[int, int], Awaitable[object]], concurrency: int, seconds: float) -> Sample:
    """``concurrency`` tasks, each committing in a loop until the window closes."""
    latencies: list[float] = []
    clock = time.perf_counter
    count = 0
    deadline = 0.0

    async def committer(task: int) -> None:
        nonlocal count
        i = 0
        now = clock()
        while now < deadline:
            await commit(task, i)
            after = clock()
            latencies.append(after - now)
            now = after
            i += 1
        count += i

    began = clock()
    deadline = began + seconds
    await asyncio.gather(*(committer(t) for t in range(concurrency)))
    return Sample(count, clock() - began, latencies)


def prewarm(wal: WriteAheadLog, segments: int) -> None:
    """Leave ``segments`` zero-filled segments free for reuse, as a checkpointed log has them.

    Segment creation (a zero fill and an fsync of the whole segment) belongs to log growth,
    not to a commit; a log in steady state recycles segments its checkpoints released.
    """
    start_seq = 0
    for _ in range(segments):
        wal.append_sync(b"prewarm")
        start_seq, _ = wal.roll()
    wal.retire_before(start_seq)


def wal_pool_segments(seconds: float, segment_size: int) -> int:
    return 1 + math.ceil(seconds * _LOG_RATE_ESTIMATE / segment_size)


async def _loop_lag(stop: list[bool], lags: list[float], period: float = 0.001) -> None:
    """How late the event loop wakes a task that sleeps ``period``: its stall, sampled."""
    clock = time.perf_counter
    while not stop[0]:
        before = clock()
        await asyncio.sleep(period)
        lags.append(max(0.0, clock() - before - period))


def afterword_wal(
    workdir: str,
    concurrency: int,
    seconds: float,
    *,
    disk: Disk | None = None,
    prewarm_pool: bool = True,
    inline_max_s: float | None = None,
    no_fsync: bool = False,
    lag: bool = False,
    high_water: bool = False,
) -> Sample:
    """``concurrency`` asyncio tasks committing 1 KiB payloads to a bare WriteAheadLog.

    ``high_water`` gives the log a HIGHWATER mark as the record store does (each write then
    also marks its last lsn, with its own fdatasync: issue 29's cost). ``inline_max_s`` sets
    the inline bound (0: every write off the loop). ``lag`` also runs a task that sleeps 1 ms in
    a loop and records how late it wakes (``extra["lag_p99_ms"]``, ``lag_max_ms``): what the
    commit path costs everything else on the loop. ``extra["stall_max_ms"]`` is the longest
    time one commit held the loop (its inline write+fdatasync).
    """
    root = StateRoot(os.path.join(workdir, "state"), disk or OsDisk())
    options = WalOptions(max_log_bytes=1 << 40, unsafe_no_fsync=no_fsync)
    if inline_max_s is not None:
        options = WalOptions(
            max_log_bytes=1 << 40, unsafe_no_fsync=no_fsync, inline_commit_max_s=inline_max_s
        )
    mark = HighWater.create(root, b"\x00" * 16, 0, 0) if high_water else None
    wal, _ = WriteAheadLog.open(root, start_seq=1, checkpoint_lsn=0, options=options, high_water=mark)
    try:
        if prewarm_pool:
            prewarm(wal, wal_pool_segments(seconds, options.segment_size))
        wal.append_sync(PAYLOAD_1K)  # the tail segment is open and hot before the window

        async def commit(task: int, i: int) -> int:
            return await wal.commit(PAYLOAD_1K)

        lags: list[float] = []

        async def measured() -> Sample:
            stop = [False]
            ticker = asyncio.create_task(_loop_lag(stop, lags)) if lag else None
            try:
                return await _drive(commit, concurrency, seconds)
            finally:
                stop[0] = True
                if ticker is not None:
                    await ticker

        sample = asyncio.run(measured())
        if lags:
            lags.sort()
            sample.extra["lag_p99_ms"] = lags[min(len(lags) - 1, int(0.99 * len(lags)))] * 1000
            sample.extra["lag_p50_ms"] = lags[len(lags) // 2] * 1000
            sample.extra["lag_max_ms"] = lags[-1] * 1000
        sample.extra["stall_max_ms"] = wal.commit_stall_max_s * 1000
        sample.extra["batches"] = float(wal.stats.batches)
        sample.extra["fsyncs"] = float(wal.stats.fsyncs)
        return sample
    finally:
        wal.close()


def afterword_store(
    workdir: str,
    concurrency: int,
    seconds: float,
    *,
    options: StoreOptions | None = None,
    high_water: bool = True,
) -> Sample:
    """``concurrency`` tasks each running ``transact([Put(key, 1 KiB)])`` in a loop.

    Default store options: the log is checkpointed when it reaches its cap, and new segments
    are created as the log grows, so this row carries the store's whole cost. Without
    ``high_water`` the open store's log stops marking HIGHWATER: the store as it was before
    issue 29, for measuring what the mark costs (never a way to run a store).
    """
    store = RecordStore.open(os.path.join(workdir, "state"), options=options)
    if not high_water and store.wal.high_water is not None:
        store.wal.high_water.close()
        store.wal.high_water = None
    try:
        store.transact_sync([Put("cont/warmup", PAYLOAD_1K)])

        async def commit(task: int, i: int) -> int:
            key = f"cont/active/{(task + i * concurrency) % KEYSPACE:08d}"
            return await store.transact([Put(key, PAYLOAD_1K)])

        sample = asyncio.run(_drive(commit, concurrency, seconds))
        stats = store.statistics()
        sample.extra["checkpoints"] = float(stats.checkpoints)
        sample.extra["fsyncs"] = float(stats.wal_fsyncs)
        return sample
    finally:
        store.close()


# -- SQLite and LMDB -----------------------------------------------------------------------------
def _sqlite_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
    )
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def sqlite_commits(workdir: str, concurrency: int, seconds: float) -> Sample:
    """``concurrency`` threads, one connection each, upserting a 1 KiB row per transaction."""
    path = os.path.join(workdir, "bench.sqlite")
    setup = _sqlite_connect(path)
    setup.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
    setup.execute("INSERT INTO kv (k, v) VALUES (0, ?)", (PAYLOAD_1K,))
    conns = [_sqlite_connect(path) for _ in range(concurrency)]
    setup.close()
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    counts = [0] * concurrency
    errors: list[BaseException] = []
    ready = threading.Barrier(concurrency + 1)
    window: list[float] = [0.0]
    clock = time.perf_counter

    def worker(t: int) -> None:
        conn, lat = conns[t], latencies[t]
        i = 0
        try:
            ready.wait()
            deadline = window[0]
            now = clock()
            while now < deadline:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)",
                    ((t + i * concurrency) % KEYSPACE, PAYLOAD_1K),
                )
                conn.execute("COMMIT")
                after = clock()
                lat.append(after - now)
                now = after
                i += 1
        except BaseException as exc:  # surfaced below: a benchmark must not hide a failure
            errors.append(exc)
        counts[t] = i

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(concurrency)]
    for th in threads:
        th.start()
    began = clock()
    window[0] = began + seconds
    ready.wait()
    for th in threads:
        th.join()
    elapsed = clock() - began
    for conn in conns:
        conn.close()
    if errors:
        raise errors[0]
    return Sample(sum(counts), elapsed, [x for lat in latencies for x in lat])


def lmdb_commits(workdir: str, seconds: float) -> Sample:
    """One writer putting a 1 KiB value per transaction into LMDB with sync and metasync on."""
    import lmdb

    env = lmdb.open(
        os.path.join(workdir, "lmdb"), map_size=1 << 30, sync=True, metasync=True, max_readers=4, mode=0o700
    )
    try:
        with env.begin(write=True) as txn:
            txn.put(b"warmup", PAYLOAD_1K)
        keys = [i.to_bytes(8, "big") for i in range(KEYSPACE)]

        def step(n: int) -> None:
            with env.begin(write=True) as txn:
                txn.put(keys[n % KEYSPACE], PAYLOAD_1K)

        return _timed_loop(step, seconds)
    finally:
        env.close()


# -- open and replay -----------------------------------------------------------------------------
def afterword_open(path: str, options: StoreOptions | None = None) -> Sample:
    """Open a prebuilt store (lock, manifest, record files, log replay) and close it."""
    began = time.perf_counter()
    store = RecordStore.open(path, options=options)
    elapsed = time.perf_counter() - began
    try:
        records = len(store)
        replayed = store.replayed
    finally:
        store.close()
    return Sample(records, elapsed, extra={"replayed": float(replayed)})


def afterword_service_open(path: str) -> Sample:
    """Open a store of the service's own records and build the indexes ``afterword serve``
    builds before it listens (:class:`~afterword.app.repository.Repository`: every live
    continuation read and decoded, each tombstone known by its catalogued summary), then close."""
    began = time.perf_counter()
    store = RecordStore.open(path)
    try:
        Repository(store)
        elapsed = time.perf_counter() - began
        records = len(store)
        unread = store.statistics().unread
    finally:
        store.close()
    return Sample(records, elapsed, extra={"unread": float(unread)})


def afterword_service_reads(path: str) -> Sample:
    """Open a store of the service's records and read what ``afterword serve`` reads at
    start, at the store's level: every live continuation's bytes and each tombstone's
    catalogued summary (no decoding, as :func:`sqlite_service_rows` does none)."""
    began = time.perf_counter()
    store = RecordStore.open(path)
    try:
        live = sum(1 for _ in store.items(LIVE))
        summaries = store.watch(TOMB, lambda *_: None, SUMMARIZER)
        elapsed = time.perf_counter() - began
        unread = store.statistics().unread
    finally:
        store.close()
    return Sample(live + len(summaries), elapsed, extra={"unread": float(unread)})


def sqlite_service_rows(path: str) -> Sample:
    """SQLite loading the same rows the service reads at start: every live continuation,
    and the tombstones' summaries from their own table (``build_sqlite_from_store``)."""
    began = time.perf_counter()
    conn = sqlite3.connect(path)
    try:
        live = {
            key: RecordImage(key, lsn, value)
            for key, lsn, value in conn.execute(
                "SELECT key, lsn, value FROM records WHERE key >= ? AND key < ?", (LIVE, LIVE[:-1] + "0")
            )
        }
        summaries = conn.execute("SELECT key, summary FROM summaries").fetchall()
    finally:
        conn.close()
    return Sample(len(live) + len(summaries), time.perf_counter() - began)


def afterword_replay(path: str, log_mib: int) -> Sample:
    """Open a store whose whole state is a ``log_mib`` log; ops are replayed transactions."""
    opened = afterword_open(path, log_options(log_mib))
    return Sample(int(opened.extra["replayed"]), opened.seconds, nbytes=log_mib * MiB)


def sqlite_open(path: str) -> Sample:
    """Connect to SQLite and load every row into the same record objects the store keeps."""
    began = time.perf_counter()
    conn = sqlite3.connect(path)
    try:
        records = {
            key: RecordImage(key, lsn, value)
            for key, lsn, value in conn.execute("SELECT key, lsn, value FROM records")
        }
    finally:
        conn.close()
    return Sample(len(records), time.perf_counter() - began)

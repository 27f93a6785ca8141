"""The job queue of ``examples/jobqueue`` beside SQLite doing the same queue: ``python -m bench.jobqueue``.

One *cycle* is the life of one job: enqueue (with a fresh idempotency key and a 256-byte
payload), lease, ack; three durable commits. Each worker loops enqueue -> lease -> ack for a
fixed window of wall time; a lease may return another worker's job (as in a real queue), and
the figure is acked jobs per second.

SQLite runs the common pattern: WAL mode, ``synchronous=FULL``, ``BEGIN IMMEDIATE``
transactions, ``INSERT ... ON CONFLICT DO NOTHING`` to enqueue,
``UPDATE ... WHERE id = (SELECT ... ORDER BY due LIMIT 1) RETURNING`` to lease (a partial
index over the due jobs keeps it cheap) and a guarded ``UPDATE`` to ack, in two setups: one
connection per worker thread (``sqlite``), and at 32 workers also one connection shared
behind a lock (``sqlite-shared``), which spares the writers SQLite's sleeping busy handler.
All are
measured in alternation within one run, at 1 and 32 workers, on the same file system; each
figure is the median of the repetitions and every ratio is taken within the run.

    python -m bench.jobqueue [--quick] [--json PATH] [--dir DIR] [--reps N] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from examples.jobqueue.queue import JobQueue

from .common import describe_filesystem, median, output_path, percentile, scratch_base, scratch_dir
from .workloads import BUSY_TIMEOUT_MS, Sample

WORKERS = (1, 32)
PAYLOAD = bytes(range(256))
LEASE_MS = 30_000
JOBQUEUE, SQLITE, SQLITE_SHARED = "jobqueue", "sqlite", "sqlite-shared"


def jobqueue_cycles(workdir: str, workers: int, seconds: float) -> Sample:
    """``workers`` tasks on one :class:`JobQueue` (default store options: real fsyncs, the
    log checkpointed at its cap), each running enqueue -> lease -> ack in a loop."""
    queue = JobQueue.open(os.path.join(workdir, "state"))
    clock = time.perf_counter
    latencies: list[float] = []
    done = [0]

    async def worker(w: int, deadline: float) -> None:
        i, now = 0, clock()
        while now < deadline:
            await queue.enqueue(f"w{w}-{i}", PAYLOAD)
            got = await queue.lease(LEASE_MS)
            if got is not None:
                await queue.ack(got[0].id, got[1])
                done[0] += 1
            after = clock()
            latencies.append(after - now)
            now, i = after, i + 1

    async def main() -> float:
        await queue.enqueue("warmup", PAYLOAD)  # the first segment exists before the window
        began = clock()
        await asyncio.gather(*(worker(w, began + seconds) for w in range(workers)))
        return clock() - began

    try:
        elapsed = asyncio.run(main())
    finally:
        queue.close()
    return Sample(done[0], elapsed, latencies)


SCHEMA = """
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, payload BLOB NOT NULL,
    state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, due INTEGER NOT NULL
);
CREATE INDEX jobs_due ON jobs (due, id) WHERE state IN ('ready', 'leased');
"""
ENQUEUE = "INSERT INTO jobs (key, payload, state, due) VALUES (?, ?, 'ready', ?) ON CONFLICT (key) DO NOTHING"
LEASE = """UPDATE jobs SET state = 'leased', attempts = attempts + 1, due = ?
WHERE id = (SELECT id FROM jobs WHERE state IN ('ready', 'leased') AND due <= ? ORDER BY due, id LIMIT 1)
RETURNING id, attempts, payload"""
ACK = "UPDATE jobs SET state = 'done', payload = x'', due = ? WHERE id = ? AND state = 'leased' AND attempts = ?"


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
    )
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _tx(conn: sqlite3.Connection, sql: str, args: tuple[object, ...]) -> list[tuple[object, ...]]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        rows = conn.execute(sql, args).fetchall()
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return rows


def sqlite_cycles(workdir: str, workers: int, seconds: float, *, shared: bool = False) -> Sample:
    """``workers`` threads running the same cycle on an SQLite queue, one connection each
    (writers wait in SQLite's busy handler), or with ``shared`` one connection behind a lock
    (writers queue in Python; what a service with one writer connection does)."""
    path = os.path.join(workdir, "queue.sqlite")
    setup = _connect(path)
    setup.executescript(SCHEMA)
    _tx(setup, ENQUEUE, ("warmup", PAYLOAD, 0))
    conns = [_connect(path)] * workers if shared else [_connect(path) for _ in range(workers)]
    gate = threading.Lock() if shared else contextlib.nullcontext()
    setup.close()
    clock = time.perf_counter
    latencies: list[list[float]] = [[] for _ in range(workers)]
    done = [0] * workers
    errors: list[BaseException] = []
    ready = threading.Barrier(workers + 1)
    window = [0.0]

    def worker(w: int) -> None:
        conn, lat, i = conns[w], latencies[w], 0
        try:
            ready.wait()
            now = clock()
            while now < window[0]:
                ms = int(time.time() * 1000)
                with gate:
                    _tx(conn, ENQUEUE, (f"w{w}-{i}", PAYLOAD, ms))
                with gate:
                    rows = _tx(conn, LEASE, (ms + LEASE_MS, ms))
                if rows:
                    job, attempts, _payload = rows[0]
                    with gate:
                        acked = _tx(conn, ACK + " RETURNING id", (ms, job, attempts))
                    done[w] += bool(acked)
                after = clock()
                lat.append(after - now)
                now, i = after, i + 1
        except BaseException as exc:  # surfaced below: a benchmark must not hide a failure
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(workers)]
    for th in threads:
        th.start()
    began = clock()
    window[0] = began + seconds
    ready.wait()
    for th in threads:
        th.join()
    elapsed = clock() - began
    for conn in set(conns):
        conn.close()
    if errors:
        raise errors[0]
    return Sample(sum(done), elapsed, [x for lat in latencies for x in lat])


@dataclass(frozen=True)
class Profile:
    reps: int
    seconds: float


FULL = Profile(reps=5, seconds=2.0)
QUICK = Profile(reps=1, seconds=0.3)


@dataclass
class Row:
    system: str
    workers: int
    jobs_per_s: float  # acked jobs per second: each one enqueue + lease + ack
    samples: list[float] = field(default_factory=list)
    p50_ms: float = 0.0  # one worker's cycle
    p99_ms: float = 0.0
    ratio_to_sqlite: float | None = None  # / SQLite (connection per worker), same workers
    ratio_to_best_sqlite: float | None = None  # / the faster of the two SQLite setups, same workers
    scaling: float | None = None  # this row / the same system at 1 worker


CASES: dict[str, Callable[[str, int, float], Sample]] = {
    JOBQUEUE: jobqueue_cycles,
    SQLITE: sqlite_cycles,
    SQLITE_SHARED: functools.partial(sqlite_cycles, shared=True),
}


def run(profile: Profile, base: str, say: Callable[[str], None]) -> list[Row]:
    # one shared connection at one worker is the per-worker setup again: not measured twice
    cases = [(system, w) for w in WORKERS for system in CASES if (system, w) != (SQLITE_SHARED, 1)]
    samples: dict[tuple[str, int], list[Sample]] = {case: [] for case in cases}
    for rep in range(profile.reps):
        shift = rep % len(cases)  # rotate the order, so drift hits every case alike
        for system, workers in cases[shift:] + cases[:shift]:
            gc.collect()
            with scratch_dir(base, prefix="afterword-jobqueue-") as workdir:
                samples[(system, workers)].append(CASES[system](workdir, workers, profile.seconds))
        say(f"repetition {rep + 1}/{profile.reps} done")
    rows = []
    for (system, workers), got in samples.items():
        p50 = [percentile(sorted(s.latencies), 50) * 1000 for s in got]
        p99 = [percentile(sorted(s.latencies), 99) * 1000 for s in got]
        rates = [s.rate for s in got]
        rows.append(Row(system, workers, median(rates), rates, median(p50), median(p99)))
    ratios(rows)
    return rows


def ratios(rows: list[Row]) -> None:
    by = {(r.system, r.workers): r for r in rows}
    for r in rows:
        sqlite = by.get((SQLITE, r.workers))
        if sqlite is not None and sqlite.jobs_per_s > 0:
            r.ratio_to_sqlite = r.jobs_per_s / sqlite.jobs_per_s
        best = max(
            (by[s, r.workers].jobs_per_s for s in (SQLITE, SQLITE_SHARED) if (s, r.workers) in by),
            default=0.0,
        )
        if best > 0:
            r.ratio_to_best_sqlite = r.jobs_per_s / best
        one = by.get((SQLITE if r.system == SQLITE_SHARED else r.system, 1))  # one worker: one setup
        if one is not None and one.jobs_per_s > 0:
            r.scaling = r.jobs_per_s / one.jobs_per_s


def render(rows: Sequence[Row]) -> str:
    head = f"{'system':14} {'workers':>7} {'jobs/s':>9} {'x SQLite':>9} {'x best SQLite':>14} {'x own 1':>8} "
    head += f"{'p50 ms':>8} {'p99 ms':>8}"
    lines = [head, "-" * len(head)]

    def fmt(x: float | None, width: int) -> str:
        return ("-" if x is None else f"{x:.2f}").rjust(width)

    for r in rows:
        lines.append(
            f"{r.system:14} {r.workers:7d} {r.jobs_per_s:9.0f} {fmt(r.ratio_to_sqlite, 9)} "
            f"{fmt(r.ratio_to_best_sqlite, 14)} {fmt(r.scaling, 8)} {r.p50_ms:8.2f} {r.p99_ms:8.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.jobqueue", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short repetition (a smoke run)")
    parser.add_argument(
        "--json", metavar="PATH", type=output_path, help="write the rows and the machine as JSON"
    )
    parser.add_argument("--dir", metavar="DIR", help="scratch directory (default: on the repo's file system)")
    parser.add_argument("--reps", type=int, help="repetitions per figure (median reported)")
    parser.add_argument("--seconds", type=float, help="measurement window of each sample")
    args = parser.parse_args(argv)
    base_profile = QUICK if args.quick else FULL
    profile = Profile(args.reps or base_profile.reps, args.seconds or base_profile.seconds)
    base = scratch_base(args.dir)
    began = time.time()
    rows = run(profile, base, lambda msg: print(f"# {msg}", file=sys.stderr, flush=True))
    fs = describe_filesystem(base)
    print(
        f"# {os.cpu_count()} cpus, {fs['fstype']} on {fs['device']} ({base}); SQLite {sqlite3.sqlite_version}"
    )
    print(f"# {profile.reps} reps of {profile.seconds} s, median; a job = enqueue + lease + ack")
    print(render(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            meta = {"profile": asdict(profile), "filesystem": fs, "sqlite": sqlite3.sqlite_version}
            meta["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began))
            json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

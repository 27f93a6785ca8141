"""One run, everything side by side on the same disk: ``python -m bench.compare``.

Systems are measured in alternation (every repetition runs every case once, in an order that
rotates between repetitions), so drift in a shared machine's disk or CPU hits all of them
alike; each figure is the median of the repetitions. Ratios are taken within the run.

    python -m bench.compare [--quick] [--json PATH] [--plot PATH] [--dir DIR] [--reps N] [--seconds S]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial

from . import workloads as w
from .common import (
    build_checkpointed_store,
    build_logged_store,
    build_sqlite_from_store,
    build_sqlite_rows,
    describe_filesystem,
    median,
    output_path,
    percentile,
    scratch_base,
    scratch_dir,
    settle,
)
from .e2e_rss import fill_state

CONCURRENCY = (1, 4, 16, 64)
STORE_CONCURRENCY = (1, 64)
LIMIT = "limit"
AFTERWORD_WAL = "afterword-wal"
AFTERWORD_STORE = "afterword-store"
# Issue 29's HIGHWATER mark, before and after in the same run: the bare log with a mark, and
# the store with its mark switched off (the rows above are the bare log and the real store).
AFTERWORD_WAL_MARK = "afterword-wal+hw"
AFTERWORD_STORE_NO_MARK = "store-without-hw"
MARK_CONCURRENCY = (1, 64)
SQLITE = "sqlite"
LMDB = "lmdb"
LIMIT_PREALLOC = "prealloc pwrite+fdatasync"


@dataclass(frozen=True)
class Profile:
    """How much to measure: the full run, or ``--quick`` (the same rows, smaller and shorter)."""

    reps: int
    seconds: float
    active: int
    tombstones: int
    log_mib: tuple[int, ...]


FULL = Profile(reps=5, seconds=2.0, active=10_000, tombstones=50_000, log_mib=(16, 64))
QUICK = Profile(reps=2, seconds=0.25, active=1_000, tombstones=5_000, log_mib=(2, 8))


@dataclass(frozen=True)
class Case:
    system: str
    setting: str
    kind: str  # "commit": 1 KiB durable transactions; "open": records loaded; "replay": transactions
    concurrency: int | None
    run: Callable[[str], w.Sample]


@dataclass
class Row:
    system: str
    setting: str
    kind: str
    concurrency: int | None
    unit: str
    ops_per_s: float
    seconds: float  # median wall time of one sample
    samples: list[float] = field(default_factory=list)  # ops/s of each repetition
    p50_ms: float | None = None
    p99_ms: float | None = None
    stall_max_ms: float | None = None  # the longest one commit held the event loop, any repetition
    mb_per_s: float | None = None
    ratio_to_limit: float | None = None
    ratio_to_sqlite: float | None = None


def all_cases(profile: Profile, fixtures: dict[str, str]) -> list[Case]:
    s = profile.seconds
    cases = [
        Case(LIMIT, LIMIT_PREALLOC, "commit", 1, partial(w.limit_prealloc, seconds=s)),
        Case(LIMIT, "append+fdatasync", "commit", 1, partial(w.limit_append, seconds=s)),
        Case(LIMIT, "tmp+fsync+rename+dir fsync", "commit", 1, partial(w.limit_rename, seconds=s)),
    ]
    for c in CONCURRENCY:
        cases.append(
            Case(AFTERWORD_WAL, f"c={c}", "commit", c, partial(w.afterword_wal, concurrency=c, seconds=s))
        )
        cases.append(Case(SQLITE, f"c={c}", "commit", c, partial(w.sqlite_commits, concurrency=c, seconds=s)))
    for c in STORE_CONCURRENCY:
        cases.append(
            Case(AFTERWORD_STORE, f"c={c}", "commit", c, partial(w.afterword_store, concurrency=c, seconds=s))
        )
    for c in MARK_CONCURRENCY:
        cases.append(
            Case(
                AFTERWORD_WAL_MARK,
                f"c={c}",
                "commit",
                c,
                partial(w.afterword_wal, concurrency=c, seconds=s, high_water=True),
            )
        )
        cases.append(
            Case(
                AFTERWORD_STORE_NO_MARK,
                f"c={c}",
                "commit",
                c,
                partial(w.afterword_store, concurrency=c, seconds=s, high_water=False),
            )
        )
    cases.append(Case(LMDB, "c=1", "commit", 1, partial(w.lmdb_commits, seconds=s)))
    label = f"open {profile.active // 1000}k+{profile.tombstones // 1000}k"
    store_path, sqlite_path = fixtures["open-store"], fixtures["open-sqlite"]
    cases.append(Case(AFTERWORD_STORE, label, "open", None, lambda _d: w.afterword_open(store_path)))
    cases.append(Case(SQLITE, label, "open", None, lambda _d: w.sqlite_open(sqlite_path)))
    # The service's own records: the open plus what `afterword serve` reads before it listens,
    # against SQLite loading the same rows.
    service_label = f"{label}, serve's indexes"
    service_path, service_sqlite = fixtures["open-service"], fixtures["open-service-sqlite"]
    cases.append(
        Case(AFTERWORD_STORE, service_label, "open", None, lambda _d: w.afterword_service_open(service_path))
    )
    cases.append(Case(SQLITE, service_label, "open", None, lambda _d: w.sqlite_open(service_sqlite)))
    reads_label = f"{label}, serve's reads"
    cases.append(
        Case(AFTERWORD_STORE, reads_label, "open", None, lambda _d: w.afterword_service_reads(service_path))
    )
    cases.append(Case(SQLITE, reads_label, "open", None, lambda _d: w.sqlite_service_rows(service_sqlite)))
    # The same, from a catalog without tombstone summaries: every tombstone read (as before them).
    unsummarized = fixtures["open-service-unsummarized"]
    cases.append(
        Case(
            AFTERWORD_STORE,
            f"{service_label}, no summaries",
            "open",
            None,
            lambda _d: w.afterword_service_open(unsummarized),
        )
    )
    for mib in profile.log_mib:
        path = fixtures[f"log-{mib}"]
        cases.append(
            Case(
                AFTERWORD_STORE,
                f"replay {mib} MiB log",
                "replay",
                None,
                partial(lambda _d, p, m: w.afterword_replay(p, m), p=path, m=mib),
            )
        )
    return cases


def build_fixtures(profile: Profile, root: str, say: Callable[[str], None]) -> dict[str, str]:
    fixtures = {
        "open-store": os.path.join(root, "open-store"),
        "open-sqlite": os.path.join(root, "open.sqlite"),
    }
    began = time.perf_counter()
    build_checkpointed_store(fixtures["open-store"], profile.active, profile.tombstones)
    build_sqlite_rows(fixtures["open-sqlite"], profile.active, profile.tombstones)
    fixtures["open-service"] = os.path.join(root, "open-service")
    fixtures["open-service-sqlite"] = os.path.join(root, "open-service.sqlite")
    fill_state(fixtures["open-service"], profile.active, profile.tombstones, "daily", "bench:conversation")
    build_sqlite_from_store(fixtures["open-service"], fixtures["open-service-sqlite"])
    fixtures["open-service-unsummarized"] = path = os.path.join(root, "open-service-unsummarized")
    fill_state(path, profile.active, profile.tombstones, "daily", "bench:conversation", summaries=False)
    for mib in profile.log_mib:
        fixtures[f"log-{mib}"] = path = os.path.join(root, f"log-{mib}")
        build_logged_store(path, mib)
    settle()
    say(f"fixtures built in {time.perf_counter() - began:.1f} s")
    return fixtures


def _summarize(case: Case, samples: Sequence[w.Sample]) -> Row:
    rates = [s.rate for s in samples]
    row = Row(
        system=case.system,
        setting=case.setting,
        kind=case.kind,
        concurrency=case.concurrency,
        unit={"commit": "commits/s", "open": "records/s", "replay": "transactions/s"}[case.kind],
        ops_per_s=median(rates),
        seconds=median([s.seconds for s in samples]),
        samples=rates,
    )
    if case.kind == "commit":
        p50s, p99s = [], []
        for s in samples:
            lat = sorted(s.latencies)
            p50s.append(percentile(lat, 50) * 1000)
            p99s.append(percentile(lat, 99) * 1000)
        row.p50_ms, row.p99_ms = median(p50s), median(p99s)
        stalls = [s.extra["stall_max_ms"] for s in samples if "stall_max_ms" in s.extra]
        row.stall_max_ms = max(stalls) if stalls else None
    if case.kind == "replay":
        row.mb_per_s = median([s.nbytes / s.seconds / 1e6 for s in samples])
    return row


def _ratios(rows: list[Row]) -> None:
    limit = next((r.ops_per_s for r in rows if r.system == LIMIT and r.setting == LIMIT_PREALLOC), math.nan)
    sqlite_commit = {r.concurrency: r.ops_per_s for r in rows if r.system == SQLITE and r.kind == "commit"}
    sqlite_open = {r.setting: r.ops_per_s for r in rows if r.system == SQLITE and r.kind == "open"}
    for r in rows:
        if r.kind == "commit":
            r.ratio_to_limit = r.ops_per_s / limit
            if r.concurrency in sqlite_commit:
                r.ratio_to_sqlite = r.ops_per_s / sqlite_commit[r.concurrency]
        elif r.kind == "open" and r.setting in sqlite_open:
            r.ratio_to_sqlite = r.ops_per_s / sqlite_open[r.setting]


def _find(rows: list[Row], system: str, setting: str) -> Row | None:
    return next((r for r in rows if r.system == system and r.setting == setting), None)


@dataclass(frozen=True)
class Target:
    target: str
    measured: float | None
    bar: float
    met: bool | None


def targets(rows: list[Row]) -> list[Target]:
    """The issue's targets, each with the measured value (a bar to report, never a test)."""
    out: list[Target] = []

    def add(name: str, measured: float | None, bar: float, higher_is_better: bool = True) -> None:
        met = None if measured is None else (measured >= bar if higher_is_better else measured <= bar)
        out.append(Target(name, measured, bar, met))

    one = _find(rows, AFTERWORD_WAL, "c=1")
    many = _find(rows, AFTERWORD_WAL, "c=64")
    add("single committer / prealloc limit >= 0.8", one.ratio_to_limit if one else None, 0.8)
    add("single committer / SQLite c=1 >= 1.3", one.ratio_to_sqlite if one else None, 1.3)
    add(
        "64 committers / own single committer >= 8",
        many.ops_per_s / one.ops_per_s if many and one else None,
        8.0,
    )
    add("64 committers / SQLite c=64 >= 5", many.ratio_to_sqlite if many else None, 5.0)
    opened = next((r for r in rows if r.system == AFTERWORD_STORE and r.kind == "open"), None)
    # ratio_to_sqlite of an open row is a rate ratio; the target is about time, its inverse.
    add(
        "store open time / SQLite open time <= 2",
        1 / opened.ratio_to_sqlite if opened and opened.ratio_to_sqlite else None,
        2.0,
        higher_is_better=False,
    )
    return out


def _fmt(x: float | None, spec: str) -> str:
    width = int(spec.split(".")[0])
    return "-".rjust(width) if x is None else format(x, spec)


def render_table(rows: list[Row]) -> str:
    head = f"{'system':16} {'setting':28} {'ops/s':>11} {'unit':15} {'x limit':>8} {'x SQLite':>9} "
    head += f"{'p50 ms':>8} {'p99 ms':>8} {'MB/s':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.system:16} {r.setting:28} {r.ops_per_s:11.0f} {r.unit:15} {_fmt(r.ratio_to_limit, '8.2f')} "
            f"{_fmt(r.ratio_to_sqlite, '9.2f')} {_fmt(r.p50_ms, '8.3f')} {_fmt(r.p99_ms, '8.3f')} "
            f"{_fmt(r.mb_per_s, '7.1f')}"
        )
    return "\n".join(lines)


def render_targets(results: list[Target]) -> str:
    lines = []
    for t in results:
        value = "n/a" if t.measured is None else f"{t.measured:.2f}"
        verdict = "n/a" if t.met is None else ("met" if t.met else "MISSED")
        lines.append(f"  {t.target:46} measured {value:>7}  {verdict}")
    return "\n".join(lines)


def machine(base: str) -> dict[str, object]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "?")
    except OSError:
        pass
    import lmdb

    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "lmdb": ".".join(map(str, lmdb.version())),
        "scratch": base,
        "filesystem": describe_filesystem(base),
    }


def plot(rows: list[Row], path: str, title: str) -> None:
    """commits/s against concurrency for afterword, SQLite and the disk's single-writer limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(system: str) -> tuple[list[int], list[float]]:
        pts = sorted((r.concurrency, r.ops_per_s) for r in rows if r.system == system and r.kind == "commit")
        return [int(c) for c, _ in pts if c is not None], [v for _, v in pts]

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=100)
    for system, label, style in (
        (AFTERWORD_WAL, "afterword WAL (group commit)", "o-"),
        (AFTERWORD_STORE, "afterword store transact (c=1, 64)", "s"),
        (SQLITE, "SQLite WAL, synchronous=FULL", "^-"),
    ):
        xs, ys = series(system)
        if xs:
            ax.plot(xs, ys, style, label=label)
    limit = _find(rows, LIMIT, LIMIT_PREALLOC)
    if limit is not None:
        ax.axhline(limit.ops_per_s, color="grey", linestyle=":", label="pwrite+fdatasync limit (1 writer)")
    lmdb_row = _find(rows, LMDB, "c=1")
    if lmdb_row is not None:
        ax.plot([1], [lmdb_row.ops_per_s], "D", color="black", label="LMDB, sync (1 writer)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(CONCURRENCY), [str(c) for c in CONCURRENCY])
    ax.set_xlabel("concurrent committers")
    ax.set_ylabel("durable 1 KiB commits/s")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def measure(cases: Sequence[Case], reps: int, base: str, say: Callable[[str], None]) -> list[Row]:
    """Every case once per repetition, the order rotating between repetitions; median rows.

    The cases must include the preallocated limit (every commit row's ``x limit``).
    """
    samples: dict[int, list[w.Sample]] = {i: [] for i in range(len(cases))}
    for rep in range(reps):
        shift = rep * len(cases) // reps
        order = list(range(len(cases)))
        order = order[shift:] + order[:shift]
        for i in order:
            gc.collect()
            with scratch_dir(base) as workdir:
                samples[i].append(cases[i].run(workdir))
        say(f"repetition {rep + 1}/{reps} done")
    rows = [_summarize(case, samples[i]) for i, case in enumerate(cases)]
    _ratios(rows)
    return rows


def run(
    profile: Profile, base: str, say: Callable[[str], None], *, kinds: Sequence[str] | None = None
) -> tuple[list[Row], dict[str, object]]:
    began = time.time()
    with scratch_dir(base, prefix="afterword-fixtures-") as fixture_root:
        if kinds is not None and "replay" not in kinds:
            profile = replace(profile, log_mib=())
        fixtures = build_fixtures(profile, fixture_root, say)
        cases = [c for c in all_cases(profile, fixtures) if kinds is None or c.kind in kinds]
        rows = measure(cases, profile.reps, base, say)
    meta: dict[str, object] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)),
        "duration_s": round(time.time() - began, 1),
        "profile": asdict(profile),
        "machine": machine(base),
    }
    return rows, meta


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the same rows, smaller and shorter (< 1 min)")
    parser.add_argument(
        "--json", metavar="PATH", type=output_path, help="write rows, targets and machine details as JSON"
    )
    parser.add_argument(
        "--plot", metavar="PATH", type=output_path, help="draw commits/s against concurrency as a PNG"
    )
    parser.add_argument("--dir", metavar="DIR", help="scratch directory (default: on the repo's file system)")
    parser.add_argument("--reps", type=int, help="repetitions per figure (median reported)")
    parser.add_argument("--seconds", type=float, help="measurement window of each commit sample")
    parser.add_argument(
        "--kinds", nargs="+", choices=["commit", "open", "replay"], help="measure only these kinds of case"
    )
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    if args.reps is not None or args.seconds is not None:
        profile = Profile(
            reps=args.reps or profile.reps,
            seconds=args.seconds or profile.seconds,
            active=profile.active,
            tombstones=profile.tombstones,
            log_mib=profile.log_mib,
        )
    base = scratch_base(args.dir)

    def say(msg: str) -> None:
        print(f"# {msg}", file=sys.stderr, flush=True)

    rows, meta = run(profile, base, say, kinds=args.kinds)
    results = targets(rows)
    m = meta["machine"]
    assert isinstance(m, dict)
    fs = m["filesystem"]
    print(f"# {m['cpus']} x {m['cpu']}, Linux {m['kernel']}, {fs['fstype']} on {fs['device']} ({base})")
    print(f"# Python {m['python']}, SQLite {m['sqlite']}, LMDB {m['lmdb']}; {profile.reps} reps, median")
    print(render_table(rows))
    print("targets:")
    print(render_targets(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(
                {"meta": meta, "rows": [asdict(r) for r in rows], "targets": [asdict(t) for t in results]},
                fh,
                indent=2,
            )
    if args.plot:
        title = f"{m['cpus']} x {m['cpu']}, {fs['fstype']} on {fs['device']}; median of {profile.reps}"
        plot(rows, args.plot, title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

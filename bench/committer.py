"""The one commit path's inline bound, side by side: ``python -m bench.committer``.

Issues 20 and 34: a lone commit is written on the event loop while write+fdatasync stays under
``WalOptions.inline_commit_max_s``, else in a worker thread. Measured in one run, in rotating
order, against the preallocated pwrite+fdatasync limit and SQLite (WAL, synchronous=FULL) with
one writer: the shipped bound (``inline``) and a zero bound (``off-loop``: every write handed
to the thread). For each: commits/s at 1 and 64 committers, the CPU cost of a commit with
fdatasync skipped (``unsafe_no_fsync``: the hand-off itself), the event loop's lag (how late a
task sleeping 1 ms wakes; p50, p99) and the longest stall one commit caused.

    python -m bench.committer [--reps N] [--seconds S] [--dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from functools import partial

from . import workloads as w
from .common import median, output_path, scratch_base, scratch_dir

MODES = {"inline": None, "off-loop": 0.0}  # None: the shipped bound


def _cases(seconds: float) -> dict[str, Callable[[str], w.Sample]]:
    cases: dict[str, Callable[[str], w.Sample]] = {
        "limit": partial(w.limit_prealloc, seconds=seconds),
        "sqlite c=1": partial(w.sqlite_commits, concurrency=1, seconds=seconds),
        "sqlite c=64": partial(w.sqlite_commits, concurrency=64, seconds=seconds),
    }
    for mode, bound in MODES.items():
        for c in (1, 64):
            cases[f"{mode} c={c}"] = partial(
                w.afterword_wal, concurrency=c, seconds=seconds, inline_max_s=bound, lag=True
            )
        cases[f"{mode} c=1 nosync"] = partial(
            w.afterword_wal, concurrency=1, seconds=seconds, inline_max_s=bound, no_fsync=True, lag=True
        )
    return cases


def run(reps: int, seconds: float, base: str, say: Callable[[str], None]) -> dict[str, dict[str, float]]:
    cases = _cases(seconds)
    names = list(cases)
    samples: dict[str, list[w.Sample]] = {n: [] for n in names}
    for rep in range(reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            with scratch_dir(base) as d:
                samples[name].append(cases[name](d))
        say(f"# repetition {rep + 1}/{reps} done")
    out: dict[str, dict[str, float]] = {}
    for name, got in samples.items():
        row = {"ops_per_s": median([s.rate for s in got])}
        for key in ("lag_p99_ms", "lag_p50_ms", "stall_max_ms"):
            values = [s.extra[key] for s in got if key in s.extra]
            if values:
                row[key] = median(values)
        out[name] = row
    limit, sqlite1, sqlite64 = (out[k]["ops_per_s"] for k in ("limit", "sqlite c=1", "sqlite c=64"))
    for mode in MODES:
        one, many = out[f"{mode} c=1"], out[f"{mode} c=64"]
        one["x_limit"] = one["ops_per_s"] / limit
        one["x_sqlite"] = one["ops_per_s"] / sqlite1
        many["x_sqlite"] = many["ops_per_s"] / sqlite64
        nosync = out[f"{mode} c=1 nosync"]
        nosync["us_per_commit"] = 1e6 / nosync["ops_per_s"] if nosync["ops_per_s"] else float("nan")
    return out


def render(out: dict[str, dict[str, float]]) -> str:
    lines = [
        f"{'case':24} {'ops/s':>9} {'x limit':>8} {'x SQLite':>9} {'us/commit':>10} {'lag p50 ms':>11} {'lag p99 ms':>11} {'stall max ms':>13}"
    ]
    for name, row in out.items():

        def f(key: str, spec: str, width: int, r: dict[str, float] = row) -> str:
            return format(r[key], spec).rjust(width) if key in r else "-".rjust(width)

        lines.append(
            f"{name:24} {row['ops_per_s']:9.0f} {f('x_limit', '.2f', 8)} {f('x_sqlite', '.2f', 9)} "
            f"{f('us_per_commit', '.1f', 10)} {f('lag_p50_ms', '.3f', 11)} {f('lag_p99_ms', '.3f', 11)} {f('stall_max_ms', '.3f', 13)}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.committer", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--dir")
    parser.add_argument("--json", type=output_path)
    args = parser.parse_args(argv)
    out = run(
        args.reps, args.seconds, scratch_base(args.dir), lambda m: print(m, file=sys.stderr, flush=True)
    )
    print(render(out))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

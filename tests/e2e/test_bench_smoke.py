"""The benchmarks still run: ``bench.compare --quick`` and the pytest-benchmark suites, once each.

No figure is asserted (times on shared machines drift); what is checked is that every system
and setting produced a positive rate, the ratios are wired to the right rows, and the
suites execute. Both commands run in a subprocess with a bounded timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from afterword.disk import StateRoot
from afterword.store import Put, RecordStore, StoreOptions
from afterword.wal import WalOptions, WriteAheadLog
from bench import compare

REPO = Path(__file__).resolve().parents[2]
CONCURRENCY = (1, 4, 16, 64)
RUN_TIMEOUT = 150  # seconds; each command normally takes well under a minute


def run_python(args: list[str], scratch: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, AFTERWORD_BENCH_DIR=str(scratch))
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.slow
def test_compare_quick_reports_every_system_and_setting(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    scratch = tmp_path / "scratch"
    # The rows' shape is checked, not their figures: a tenth of a second per timed case is enough.
    argv = ["-m", "bench.compare", "--quick", "--seconds", "0.1", "--json", str(out), "--dir", str(scratch)]
    proc = run_python(argv, scratch)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = {(r["system"], r["setting"]): r for r in data["rows"]}

    expected = {
        ("limit", "prealloc pwrite+fdatasync"),
        ("limit", "append+fdatasync"),
        ("limit", "tmp+fsync+rename+dir fsync"),
        ("lmdb", "c=1"),
        ("afterword-store", "c=1"),
        ("afterword-store", "c=64"),
    }
    expected |= {(system, f"c={c}") for system in ("afterword-wal", "sqlite") for c in CONCURRENCY}
    # Issue 29: the HIGHWATER mark's cost, before and after in the same run.
    expected |= {
        (system, f"c={c}")
        for system in (compare.AFTERWORD_WAL_MARK, compare.AFTERWORD_STORE_NO_MARK)
        for c in compare.MARK_CONCURRENCY
    }
    assert expected <= rows.keys()
    opens = {r["system"] for r in data["rows"] if r["kind"] == "open"}
    assert opens == {"afterword-store", "sqlite"}
    # The service's start: what serve reads (and the indexes it builds), each against SQLite
    # loading the same rows; and the same from a catalog without tombstone summaries.
    label = next(r["setting"] for r in data["rows"] if r["kind"] == "open")
    for what in ("serve's reads", "serve's indexes"):
        ours, theirs = rows[("afterword-store", f"{label}, {what}")], rows[("sqlite", f"{label}, {what}")]
        assert ours["ratio_to_sqlite"] == pytest.approx(ours["ops_per_s"] / theirs["ops_per_s"])
    assert ("afterword-store", f"{label}, serve's indexes, no summaries") in rows
    replays = [r for r in data["rows"] if r["kind"] == "replay"]
    assert len(replays) == 2 and all(r["mb_per_s"] > 0 for r in replays)

    reps = data["meta"]["profile"]["reps"]
    for r in data["rows"]:
        assert r["ops_per_s"] > 0, r
        assert len(r["samples"]) == reps and all(s > 0 for s in r["samples"]), r
    for (system, setting), r in rows.items():
        if r["kind"] == "commit":
            assert r["p50_ms"] > 0 and r["p99_ms"] >= r["p50_ms"], (system, setting)
            assert r["ratio_to_limit"] > 0

    # Ratios point at the right rows: the limit is 1x itself, SQLite 1x itself at each c.
    assert rows[("limit", "prealloc pwrite+fdatasync")]["ratio_to_limit"] == pytest.approx(1.0)
    for c in CONCURRENCY:
        assert rows[("sqlite", f"c={c}")]["ratio_to_sqlite"] == pytest.approx(1.0)
        wal = rows[("afterword-wal", f"c={c}")]
        sqlite = rows[("sqlite", f"c={c}")]
        assert wal["ratio_to_sqlite"] == pytest.approx(wal["ops_per_s"] / sqlite["ops_per_s"])

    assert [t["target"] for t in data["targets"]] == [t.target for t in compare.targets([])]
    assert all(t["measured"] is not None and t["measured"] > 0 for t in data["targets"])
    assert data["meta"]["machine"]["filesystem"]["fstype"]


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.slow
def test_benchmark_suites_execute_once(tmp_path: Path) -> None:
    proc = run_python(["-m", "pytest", "bench", "-q", "--benchmark-disable", "-x", "-n", "0"], tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout


def _row(system: str, setting: str, kind: str, concurrency: int | None, ops: float) -> compare.Row:
    unit = {"commit": "commits/s", "open": "records/s", "replay": "transactions/s"}[kind]
    return compare.Row(system, setting, kind, concurrency, unit, ops, 1.0, [ops])


def synthetic_rows() -> list[compare.Row]:
    rows = [_row("limit", compare.LIMIT_PREALLOC, "commit", 1, 1000.0)]
    for c, wal, sqlite in ((1, 900.0, 600.0), (4, 2000.0, 500.0), (16, 6000.0, 400.0), (64, 9000.0, 300.0)):
        rows.append(_row("afterword-wal", f"c={c}", "commit", c, wal))
        rows.append(_row("sqlite", f"c={c}", "commit", c, sqlite))
    rows.append(_row("afterword-store", "open 10k+50k", "open", None, 20_000.0))
    rows.append(_row("sqlite", "open 10k+50k", "open", None, 100_000.0))
    compare._ratios(rows)
    return rows


def test_committer_bench_reports_the_inline_bound_with_ratios_loop_lag_and_stall(tmp_path: Path) -> None:
    from bench import committer

    out = committer.run(1, 0.05, str(tmp_path), lambda _m: None)
    for mode in committer.MODES:
        one = out[f"{mode} c=1"]
        assert one["ops_per_s"] > 0 and one["x_limit"] > 0 and one["x_sqlite"] > 0 and "lag_p99_ms" in one
        assert one["stall_max_ms"] >= 0
        assert out[f"{mode} c=64"]["x_sqlite"] > 0 and out[f"{mode} c=1 nosync"]["us_per_commit"] > 0
    assert out["off-loop c=1"]["stall_max_ms"] == 0  # a zero bound never holds the loop
    assert "inline c=1" in committer.render(out)


def test_targets_are_computed_from_the_right_rows() -> None:
    results = {t.target: t for t in compare.targets(synthetic_rows())}
    measured = {name: t.measured for name, t in results.items()}
    assert measured == {
        "single committer / prealloc limit >= 0.8": pytest.approx(0.9),
        "single committer / SQLite c=1 >= 1.3": pytest.approx(1.5),
        "64 committers / own single committer >= 8": pytest.approx(10.0),
        "64 committers / SQLite c=64 >= 5": pytest.approx(30.0),
        "store open time / SQLite open time <= 2": pytest.approx(5.0),
    }
    met = {name: t.met for name, t in results.items()}
    assert met == dict.fromkeys(measured, True) | {"store open time / SQLite open time <= 2": False}
    table = compare.render_table(synthetic_rows())
    assert "afterword-wal" in table and "30.00" in table  # 9000 / 300 at c=64


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "chart.png"
    compare.plot(synthetic_rows(), str(out), "synthetic")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.anyio
async def test_group_commit_takes_every_ready_committer_into_one_batch(state_dir: str) -> None:
    """The batching the commit figures rest on: a round of committers shares one write.

    Committers woken by a finished batch re-queue before the leader takes the queue, so each
    round of ``committers`` commits is one batch (one fdatasync), not a batch of one followed
    by a batch of the rest.
    """
    root = StateRoot(state_dir)
    options = WalOptions(unsafe_no_fsync=True, zero_fill=False)
    wal, _ = WriteAheadLog.open(root, start_seq=1, checkpoint_lsn=0, options=options)
    wal.append_sync(b"segment")
    rounds, committers = 20, 8

    async def committer() -> None:
        for _ in range(rounds):
            await wal.commit(b"x" * 100)

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(committers):
                tg.start_soon(committer)
        assert wal.stats.commits == 1 + rounds * committers
        assert wal.stats.batches - 1 <= rounds + 1, wal.stats
    finally:
        wal.close()


@pytest.mark.anyio
async def test_a_full_log_is_checkpointed_once_not_once_per_waiting_committer(state_dir: str) -> None:
    """Committers that all see the log full at once share one automatic checkpoint."""
    wal = WalOptions(
        segment_size=64 * 1024,
        max_payload=4096,
        max_log_bytes=128 * 1024,
        unsafe_no_fsync=True,
        zero_fill=False,
    )
    store = RecordStore.open(state_dir, options=StoreOptions(wal=wal))
    committers, rounds = 16, 20

    async def committer(task: int) -> None:
        for i in range(rounds):
            await store.transact([Put(f"k/{task}/{i % 4}", b"v" * 1000)])

    try:
        async with anyio.create_task_group() as tg:
            for task in range(committers):
                tg.start_soon(committer, task)
        stats = store.statistics()
        # ~320 KiB of transactions through a log checkpointed at two 64 KiB segments: about
        # five fills. A checkpoint per committer that saw a fill would make dozens.
        assert 1 <= stats.checkpoints <= 8, stats
        assert len(store) == committers * 4
    finally:
        store.close()


def test_service_open_workloads_read_no_tombstone(tmp_path: Path) -> None:
    """The two service-start workloads leave every tombstone unread (they measure what serve
    reads, not more), and a catalog without summaries makes the open read them all."""
    from bench import workloads
    from bench.common import build_sqlite_from_store
    from bench.e2e_rss import fill_state

    os.chmod(tmp_path, 0o700)
    fill_state(str(tmp_path / "s"), 20, 50, "daily", "c")
    fill_state(str(tmp_path / "n"), 20, 50, "daily", "c", summaries=False)
    build_sqlite_from_store(str(tmp_path / "s"), str(tmp_path / "s.sqlite"))
    assert workloads.afterword_service_reads(str(tmp_path / "s")).extra["unread"] == 50
    assert workloads.afterword_service_open(str(tmp_path / "s")).extra["unread"] == 50
    assert workloads.afterword_service_open(str(tmp_path / "n")).extra["unread"] == 0
    assert workloads.sqlite_service_rows(str(tmp_path / "s.sqlite")).ops == 70


@pytest.mark.parametrize("high_water", [True, False])
def test_mark_rows_measure_the_store_with_and_without_its_mark(tmp_path: Path, high_water: bool) -> None:
    """``store-without-hw`` must really be the store before issue 29 (no mark written), and
    ``afterword-store`` the store with it, or the cost the rows show is no cost at all."""
    from _highwater import current_mark

    from bench import workloads

    os.chmod(tmp_path, 0o700)
    sample = workloads.afterword_store(str(tmp_path), 1, 0.05, high_water=high_water)
    assert sample.rate > 0
    marked = current_mark(str(tmp_path / "state")).lsn
    assert (marked > 1) is high_water

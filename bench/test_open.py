"""Recovery benchmarks: replay of a 16 MiB and a 64 MiB log; opening 10k active + 50k tombstones.

Fixtures are built once per session and opened every round (an open with a clean log writes
nothing but its ownership lock), so rounds after the first read from the page cache: these
figures are the CPU cost of recovery, not the disk's read bandwidth.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from bench import workloads as w
from bench.common import (
    MiB,
    Size,
    build_checkpointed_store,
    build_logged_store,
    build_sqlite_rows,
    median_seconds,
    scratch_dir,
    settle,
)


@pytest.fixture(scope="session")
def logs(scratch_root: str, size: Size) -> Iterator[dict[int, tuple[str, int, int]]]:
    """Nominal MiB -> (store path, MiB actually logged, transactions)."""
    with scratch_dir(scratch_root, prefix="logs-") as root:
        built = {}
        for nominal in (16, 64):
            mib = size(nominal, 1)
            path = os.path.join(root, f"log-{nominal}")
            built[nominal] = (path, mib, build_logged_store(path, mib))
        settle()
        yield built


@pytest.fixture(scope="session")
def opened_fixture(scratch_root: str, size: Size) -> Iterator[tuple[str, str, int]]:
    """(store path, SQLite path, rows): 10,000 active records and 50,000 small tombstones."""
    active, tombstones = size(10_000, 100), size(50_000, 500)
    with scratch_dir(scratch_root, prefix="open-") as root:
        store, db = os.path.join(root, "store"), os.path.join(root, "rows.sqlite")
        build_checkpointed_store(store, active, tombstones)
        build_sqlite_rows(db, active, tombstones)
        settle()
        yield store, db, active + tombstones


@pytest.mark.parametrize("nominal", [16, 64])
def test_replay(benchmark: BenchmarkFixture, logs: dict[int, tuple[str, int, int]], nominal: int) -> None:
    benchmark.group = "replay"
    path, mib, transactions = logs[nominal]
    sample = benchmark.pedantic(w.afterword_replay, args=(path, mib), rounds=5, iterations=1)
    assert sample.ops == transactions
    seconds = median_seconds(benchmark)
    if seconds:
        benchmark.extra_info.update(
            mb_per_s=mib * MiB / seconds / 1e6, transactions_per_s=transactions / seconds
        )


@pytest.mark.parametrize("system", ["afterword", "sqlite"])
def test_open_active_and_tombstones(
    benchmark: BenchmarkFixture, opened_fixture: tuple[str, str, int], system: str
) -> None:
    """The store's open against SQLite loading the same rows into the same record objects."""
    benchmark.group = "open-10k-active-50k-tombstones"
    store, db, rows = opened_fixture
    if system == "afterword":
        sample = benchmark.pedantic(w.afterword_open, args=(store,), rounds=5, iterations=1)
    else:
        sample = benchmark.pedantic(w.sqlite_open, args=(db,), rounds=5, iterations=1)
    assert sample.ops == rows
    seconds = median_seconds(benchmark)
    if seconds:
        benchmark.extra_info["records_per_s"] = rows / seconds

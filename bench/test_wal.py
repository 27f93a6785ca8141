"""WAL commit benchmarks: one 1 KiB transaction, and group commit at 1/4/16/64 committers.

Durable rounds use the production disk seam; ``nosync`` rounds use :class:`NoSyncDisk`, which
shows what everything except the fsync costs. The two are kept in separate groups.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from afterword.disk import Disk, OsDisk, StateRoot
from afterword.wal import WalOptions, WriteAheadLog
from bench.common import PAYLOAD_1K, Closable, Fresh, NoSyncDisk, Size, median_seconds, percentile

DISKS: dict[str, Callable[[], Disk]] = {"durable": OsDisk, "nosync": NoSyncDisk}


def open_wal(path: str, variant: str) -> WriteAheadLog:
    root = StateRoot(os.path.join(path, "state"), DISKS[variant]())
    wal, _ = WriteAheadLog.open(
        root, start_seq=1, checkpoint_lsn=0, options=WalOptions(max_log_bytes=1 << 40)
    )
    # The first write creates and zero-fills a segment: setup work, not the commit measured.
    wal.append_sync(PAYLOAD_1K)
    return wal


@pytest.mark.parametrize("variant", ["durable", "nosync"])
def test_wal_commit_1k_sync(
    benchmark: BenchmarkFixture, fresh: Fresh, closing: list[Closable], size: Size, variant: str
) -> None:
    """``append_sync``: one committer, no event loop (tools, migrations, ``transact_sync``)."""
    benchmark.group = f"wal-commit-1k-{variant}"

    def setup() -> tuple[tuple[WriteAheadLog], dict[str, object]]:
        wal = open_wal(fresh(), variant)
        closing.append(wal)
        return (wal,), {}

    lsn = benchmark.pedantic(
        lambda wal: wal.append_sync(PAYLOAD_1K), setup=setup, rounds=size(40, 1), iterations=1
    )
    assert lsn == 2


@pytest.mark.parametrize("variant", ["durable", "nosync"])
def test_wal_commit_1k_async(
    benchmark: BenchmarkFixture, fresh: Fresh, closing: list[Closable], size: Size, variant: str
) -> None:
    """``await commit``: one committer on an event loop (the leader hands the write to a thread)."""
    benchmark.group = f"wal-commit-1k-{variant}"
    runner = asyncio.Runner()
    closing.append(runner)

    def setup() -> tuple[tuple[WriteAheadLog], dict[str, object]]:
        wal = open_wal(fresh(), variant)
        closing.append(wal)
        return (wal,), {}

    lsn = benchmark.pedantic(
        lambda wal: runner.run(wal.commit(PAYLOAD_1K)), setup=setup, rounds=size(40, 1), iterations=1
    )
    assert lsn == 2


async def burst(wal: WriteAheadLog, concurrency: int, per_task: int, latencies: list[float]) -> None:
    """``concurrency`` tasks each committing ``per_task`` payloads back to back."""
    clock = time.perf_counter

    async def committer() -> None:
        for _ in range(per_task):
            began = clock()
            await wal.commit(PAYLOAD_1K)
            latencies.append(clock() - began)

    await asyncio.gather(*(committer() for _ in range(concurrency)))


@pytest.mark.parametrize("variant", ["durable", "nosync"])
@pytest.mark.parametrize("concurrency", [1, 4, 16, 64])
def test_group_commit(
    benchmark: BenchmarkFixture,
    fresh: Fresh,
    closing: list[Closable],
    size: Size,
    variant: str,
    concurrency: int,
) -> None:
    """A round is a burst of 2,048 commits from ``concurrency`` tasks sharing fdatasyncs."""
    benchmark.group = f"group-commit-{variant}"
    per_task = size(2048, 64) // concurrency or 1
    latencies: list[float] = []
    wals: list[WriteAheadLog] = []

    def setup() -> tuple[tuple[WriteAheadLog], dict[str, object]]:
        wal = open_wal(fresh(), variant)
        closing.append(wal)
        wals.append(wal)
        return (wal,), {}

    benchmark.pedantic(
        lambda wal: asyncio.run(burst(wal, concurrency, per_task, latencies)),
        setup=setup,
        rounds=size(5, 1),
        iterations=1,
    )
    commits = per_task * concurrency
    assert all(wal.stats.commits == commits + 1 for wal in wals)
    lat = sorted(latencies)
    benchmark.extra_info.update(
        commits_per_round=commits,
        p50_ms=percentile(lat, 50) * 1000,
        p99_ms=percentile(lat, 99) * 1000,
        commits_per_fsync=commits / max(1, wals[-1].stats.fsyncs - 1),
    )
    seconds = median_seconds(benchmark)
    if seconds:
        benchmark.extra_info["commits_per_s"] = commits / seconds

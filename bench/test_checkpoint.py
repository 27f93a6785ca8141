"""Checkpoint benchmarks: materialize 1,000 or 10,000 dirty records as record files.

A round's setup opens a fresh store and commits the dirty records (500 per transaction, no
automatic checkpoint); the round is ``checkpoint_sync``: one atomic replace per record, one
directory fsync, a new manifest.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from afterword.disk import Disk, OsDisk
from afterword.store import Put, RecordStore, StoreOptions
from afterword.wal import WalOptions
from bench.common import ACTIVE_VALUE_BYTES, Closable, Fresh, NoSyncDisk, Size, active_key, median_seconds

DISKS: dict[str, Callable[[], Disk]] = {"durable": OsDisk, "nosync": NoSyncDisk}
OPTIONS = StoreOptions(wal=WalOptions(max_log_bytes=1 << 40), auto_checkpoint=False)
VALUE = b"v" * ACTIVE_VALUE_BYTES


@pytest.mark.parametrize("variant", ["durable", "nosync"])
@pytest.mark.parametrize("dirty", [1000, 10_000])
def test_checkpoint(
    benchmark: BenchmarkFixture, fresh: Fresh, closing: list[Closable], size: Size, variant: str, dirty: int
) -> None:
    benchmark.group = f"checkpoint-{variant}"
    n = size(dirty, dirty // 100)

    def setup() -> tuple[tuple[RecordStore], dict[str, object]]:
        store = RecordStore.open(os.path.join(fresh(), "state"), disk=DISKS[variant](), options=OPTIONS)
        closing.append(store)
        for start in range(0, n, 500):
            store.transact_sync([Put(active_key(i), VALUE) for i in range(start, min(n, start + 500))])
        return (store,), {}

    def checkpoint(store: RecordStore) -> RecordStore:
        store.checkpoint_sync()
        return store

    store = benchmark.pedantic(checkpoint, setup=setup, rounds=size(3, 1), iterations=1)
    assert store.statistics().dirty == 0
    assert len(os.listdir(os.path.join(store.root.root, "records"))) == n
    seconds = median_seconds(benchmark)
    if seconds:
        benchmark.extra_info["records_per_s"] = n / seconds

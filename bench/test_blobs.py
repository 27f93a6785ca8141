"""Blob store benchmarks: put and get of 64 KiB and 256 KiB snapshots.

``put`` writes a blob durably (temp file, fsync, rename, directory fsync) under fresh content
every round; ``get`` reads one back and verifies its blake3 digest.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from afterword.blobs import BlobStore, blob_digest
from afterword.disk import Disk, OsDisk, StateRoot
from bench.common import Fresh, KiB, NoSyncDisk, Size, median_seconds

DISKS: dict[str, Callable[[], Disk]] = {"durable": OsDisk, "nosync": NoSyncDisk}
SECRET = bytes(range(32))


def blob_store(path: str, variant: str) -> BlobStore:
    return BlobStore(StateRoot(os.path.join(path, "state"), DISKS[variant]()), SECRET)


@pytest.mark.parametrize("variant", ["durable", "nosync"])
@pytest.mark.parametrize("kib", [64, 256])
def test_blob_put(benchmark: BenchmarkFixture, fresh: Fresh, size: Size, variant: str, kib: int) -> None:
    benchmark.group = f"blob-put-{variant}"

    def setup() -> tuple[tuple[BlobStore, bytes], dict[str, object]]:
        return (blob_store(fresh(), variant), os.urandom(kib * KiB)), {}

    digest = benchmark.pedantic(
        lambda blobs, data: blobs.put(data), setup=setup, rounds=size(20, 1), iterations=1
    )
    assert len(digest) == 64
    seconds = median_seconds(benchmark)
    if seconds:
        benchmark.extra_info["mb_per_s"] = kib * KiB / seconds / 1e6


@pytest.mark.parametrize("kib", [64, 256])
def test_blob_get(benchmark: BenchmarkFixture, fresh: Fresh, size: Size, kib: int) -> None:
    benchmark.group = "blob-get"

    def setup() -> tuple[tuple[BlobStore, str], dict[str, object]]:
        blobs = blob_store(fresh(), "durable")
        return (blobs, blobs.put(os.urandom(kib * KiB))), {}

    digest, data = benchmark.pedantic(
        lambda blobs, digest: (digest, blobs.get(digest)), setup=setup, rounds=size(20, 1), iterations=1
    )
    assert len(data) == kib * KiB and blob_digest(data) == digest
    seconds = median_seconds(benchmark)
    if seconds:
        benchmark.extra_info["mb_per_s"] = kib * KiB / seconds / 1e6

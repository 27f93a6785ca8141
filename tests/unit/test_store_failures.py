"""Injected I/O failures through the disk seam: a failed fsync or write poisons the store.

After the failure the store acknowledges nothing more and never retries the fsync; reopening
on a healthy disk recovers a state that holds every acknowledged commit.
"""

from __future__ import annotations

import anyio
import pytest
from _disk_helpers import SMALL, FaultyDisk

from afterword.disk import DiskFailedError, DurabilityError
from afterword.store import Delete, Put, RecordStore

Outcome = tuple[str, bytes, BaseException | None]


def assert_refuses_everything(store: RecordStore, disk: FaultyDisk) -> None:
    """Every later write path says DiskFailedError without touching the disk again."""
    syncs, writes = disk.syncs(), disk.calls["pwrite"]
    with pytest.raises(DiskFailedError):
        store.transact_sync([Put("late:sync", b"x")])
    with pytest.raises(DiskFailedError):
        store.checkpoint_sync()
    assert store.get("late:sync") is None
    assert (disk.syncs(), disk.calls["pwrite"]) == (syncs, writes), "retried I/O after a failure"


async def assert_refuses_everything_async(store: RecordStore, disk: FaultyDisk) -> None:
    syncs, writes = disk.syncs(), disk.calls["pwrite"]
    with pytest.raises(DiskFailedError):
        await store.transact([Put("late:async", b"x")])
    with pytest.raises(DiskFailedError):
        await store.checkpoint()
    assert store.get("late:async") is None
    assert_refuses_everything(store, disk)
    assert (disk.syncs(), disk.calls["pwrite"]) == (syncs, writes), "retried I/O after a failure"


def check_recovered(path: str, acked: dict[str, bytes | None], maybe: dict[str, bytes]) -> None:
    """Reopen on a healthy disk: every acknowledged commit is there; an unacknowledged one
    may be there (its bytes reached the page cache) but only with its own value."""
    with RecordStore.open(path, options=SMALL) as store:
        got = {rec.key: rec.value for rec in store.items()}
        for key, value in acked.items():
            assert got.get(key) == value, key
        for key, value in got.items():
            assert key in acked or maybe.get(key) == value, key
        store.transact_sync([Put("after:reopen", b"writable again")])
    with RecordStore.open(path, options=SMALL) as store:
        assert store.get("after:reopen") is not None


async def commit_all(store: RecordStore, items: list[tuple[str, bytes]]) -> list[Outcome]:
    """Commit each item in its own task, all at once (they share group-commit batches)."""
    outcomes: list[Outcome] = []

    async def one(key: str, value: bytes) -> None:
        try:
            await store.transact([Put(key, value)])
        except (DurabilityError, DiskFailedError) as exc:
            outcomes.append((key, value, exc))
        else:
            outcomes.append((key, value, None))

    async with anyio.create_task_group() as tg:
        for key, value in items:
            tg.start_soon(one, key, value)
    return outcomes


@pytest.mark.anyio
async def test_fdatasync_failure_fails_concurrent_commits_and_poisons(state_dir: str) -> None:
    disk = FaultyDisk()
    store = RecordStore.open(state_dir, disk=disk, options=SMALL)
    acked: dict[str, bytes | None] = {}
    try:
        for outcome in await commit_all(store, [(f"ok:{i}", b"before %d" % i) for i in range(6)]):
            assert outcome[2] is None
            acked[outcome[0]] = outcome[1]
        await store.transact([Delete("ok:0")])
        acked["ok:0"] = None

        disk.fail_fdatasync = True
        doomed = {f"doomed:{i}": b"unacknowledged %d" % i for i in range(8)}
        outcomes = await commit_all(store, list(doomed.items()))
        assert disk.failures["fdatasync"] == 1, "an fsync was retried"
        errors = [exc for _, _, exc in outcomes]
        assert all(exc is not None for exc in errors), "a commit was acknowledged after EIO"
        assert any(isinstance(exc, DurabilityError) for exc in errors)
        durability = next(exc for exc in errors if isinstance(exc, DurabilityError))
        assert durability.operation == "fdatasync" and durability.path.endswith(".seg")
        for key in doomed:
            assert store.get(key) is None
        assert store.get("ok:0") is None and store.get("ok:1") is not None

        disk.fail_fdatasync = False  # the disk "recovers": the store must still refuse
        await assert_refuses_everything_async(store, disk)
    finally:
        store.close()
    check_recovered(state_dir, acked, doomed)


def test_fdatasync_failure_in_sync_commit(state_dir: str) -> None:
    disk = FaultyDisk()
    with RecordStore.open(state_dir, disk=disk, options=SMALL) as store:
        store.transact_sync([Put("a", b"1")])
        disk.fail_fdatasync = True
        with pytest.raises(DurabilityError) as info:
            store.transact_sync([Put("b", b"2")])
        assert info.value.operation == "fdatasync"
        assert store.get("b") is None
        disk.fail_fdatasync = False
        assert_refuses_everything(store, disk)
    check_recovered(state_dir, {"a": b"1"}, {"b": b"2"})


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.anyio
async def test_write_failure_poisons(state_dir: str, mode: str) -> None:
    disk = FaultyDisk()
    with RecordStore.open(state_dir, disk=disk, options=SMALL) as store:
        store.transact_sync([Put("a", b"1")])
        disk.fail_pwrite = True
        with pytest.raises(DurabilityError) as info:
            if mode == "sync":
                store.transact_sync([Put("b", b"2")])
            else:
                await store.transact([Put("b", b"2")])
        assert info.value.operation == "write"
        assert disk.failures["pwrite"] == 1
        assert store.get("b") is None
        disk.fail_pwrite = False
        await assert_refuses_everything_async(store, disk)
    check_recovered(state_dir, {"a": b"1"}, {})


@pytest.mark.anyio
async def test_fsync_failure_during_checkpoint(state_dir: str) -> None:
    disk = FaultyDisk()
    acked: dict[str, bytes | None] = {}
    with RecordStore.open(state_dir, disk=disk, options=SMALL) as store:
        for i in range(20):
            key, value = f"k:{i}", b"v%d" % i
            await store.transact([Put(key, value)])
            acked[key] = value
        await store.transact([Delete("k:3")])
        acked["k:3"] = None
        disk.fail_fsync = True  # the record files' fsync inside the atomic replace
        # Record files are written by parallel workers: the first to fail poisons the root and
        # the others are refused, so the checkpoint may surface either error.
        with pytest.raises((DurabilityError, DiskFailedError)):
            await store.checkpoint()
        cause = store.root.failed
        assert isinstance(cause, DurabilityError) and cause.operation == "fsync"
        assert "/records/" in cause.path
        disk.fail_fsync = False
        # Reads still serve the committed state; writes are refused.
        assert store.get("k:7") is not None and store.get("k:3") is None
        await assert_refuses_everything_async(store, disk)
    # Half-written checkpoints (some record files replaced, old manifest) recover fully.
    check_recovered(state_dir, acked, {})


def test_segment_creation_failure_poisons(state_dir: str) -> None:
    # The commit needs a brand-new segment whose fsync fails: the log must not go on as if
    # the segment existed.
    disk = FaultyDisk()
    big = 2 * 1024 * 1024
    with RecordStore.open(state_dir, disk=disk, options=SMALL) as store:
        store.transact_sync([Put("a", b"1")])
        store.transact_sync([Put("big:1", b"x" * big)])
        store.transact_sync([Put("big:2", b"z" * big)])
        segments = store.wal.log_bytes
        disk.fail_fsync = True
        with pytest.raises(DurabilityError) as info:
            # With its shadow copy it does not fit the first segment.
            store.transact_sync([Put("big:3", b"y" * big)])
        assert info.value.operation == "fsync" and info.value.path.endswith(".seg")
        disk.fail_fsync = False
        assert store.get("big:3") is None
        assert_refuses_everything(store, disk)
        assert store.wal.log_bytes >= segments
    check_recovered(state_dir, {"a": b"1", "big:1": b"x" * big, "big:2": b"z" * big}, {})

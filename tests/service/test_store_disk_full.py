"""Issue 14 item 6: a full disk gets a clear, retryable refusal, never a half-made segment.

A new log segment is created whole (temporary name, zeros, fsync, rename) before any byte of
the batch that needs it is written, so running out of space there changes nothing: the
writers get ``StorageFullError`` (HTTP 503 ``storage_full`` with Retry-After), health says
unhealthy with the cause, a metric shows it, and once space is back the same store (or a
restarted one) writes on with no hole in its log.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import anyio
import pytest

from afterword.disk import OsDisk, StorageFullError, safe
from afterword.disk import root as disk_root
from afterword.store import Put, RecordStore, StoreOptions, open_readonly
from afterword.wal import WalOptions

OPTIONS = StoreOptions(
    wal=WalOptions(segment_size=8192, max_payload=2048, max_log_bytes=1 << 20, zero_fill=True),
    auto_checkpoint=False,
)


class FullDisk(OsDisk):
    """While ``full``: no write may grow a file (what ENOSPC refuses); rewrites in place work."""

    def __init__(self) -> None:
        self.full = False
        self.eio = False

    def fdatasync(self, fd: int) -> None:
        if self.eio:
            raise OSError(errno.EIO, "Input/output error")
        super().fdatasync(fd)

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        if self.full and offset + len(data) > os.fstat(fd).st_size:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().pwrite(fd, data, offset)

    def ftruncate(self, fd: int, length: int) -> None:
        if self.full and length > os.fstat(fd).st_size:
            raise OSError(errno.ENOSPC, "No space left on device")
        super().ftruncate(fd, length)


def _wal_files(path: str) -> list[str]:
    return sorted(os.listdir(os.path.join(path, "wal")))


def _to_segment_end(store: RecordStore, prefix: str) -> int:
    """Commit until a second segment exists (so its slot is the fresh tail); return count."""
    n = 0
    while len(_wal_files(store.root.root)) < 2:
        store.transact_sync([Put(f"{prefix}:{n}", b"x" * 1000)])
        n += 1
    return n


def test_sync_commit_refused_whole_then_retry_succeeds(tmp_path: Path) -> None:
    path, disk = str(tmp_path), FullDisk()
    store = RecordStore.open(path, disk=disk, options=OPTIONS)
    acked = _to_segment_end(store, "a")
    before = _wal_files(path)
    disk.full = True  # commits go on into the preallocated tail until it needs a new slot
    with pytest.raises(StorageFullError):
        for _ in range(20):
            store.transact_sync([Put(f"a:{acked}", b"x" * 1000)])
            acked += 1
    assert store.root.failed is None  # nothing was written: not poisoned
    assert _wal_files(path) == before  # no partial segment, no temporary left
    problem = store.storage_problem()
    assert problem is not None and problem[0] == "storage_full"
    assert store.get(f"a:{acked}") is None and store.latest_version(f"a:{acked}") is None
    disk.full = False
    lsn = store.transact_sync([Put("after", b"space is back")])
    assert lsn == acked + 1 and store.storage_problem() is None
    store.close()
    with RecordStore.open(path, options=OPTIONS) as again:
        assert len(again) == acked + 1 and again.get("after") is not None


@pytest.mark.anyio
async def test_group_commits_refused_together_and_lsns_reused(tmp_path: Path) -> None:
    path, disk = str(tmp_path), FullDisk()
    store = RecordStore.open(path, disk=disk, options=OPTIONS)
    store.transact_sync([Put("k:0", b"v0")])
    store.checkpoint_sync()  # the next write starts a new segment life
    disk.full = True
    errors: list[BaseException] = []

    async def one(i: int) -> None:
        try:
            await store.transact([Put(f"g:{i}", b"y" * 1500)], expect={f"g:{i}": None})
        except StorageFullError as exc:
            errors.append(exc)

    needs_slot = len([n for n in _wal_files(path) if n.endswith(".seg")])
    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
    # Enough bytes to need a new slot: every commit of the refused batch failed together.
    assert errors and store.root.failed is None
    assert all(store.latest_version(f"g:{i}") is None for i in range(6))
    disk.full = False
    lsns = []
    for i in range(6):
        lsns.append(await store.transact([Put(f"g:{i}", b"z")], expect={f"g:{i}": None}))
    assert lsns == sorted(lsns) and lsns[0] == 2, lsns  # the void lsns were handed out again
    store.close()
    view = open_readonly(path, options=OPTIONS)
    assert {r.key for r in view.items()} == {"k:0", *(f"g:{i}" for i in range(6))}
    assert needs_slot >= 1


def test_restart_while_full_and_after_space_is_back(tmp_path: Path) -> None:
    path, disk = str(tmp_path), FullDisk()
    with RecordStore.open(path, disk=disk, options=OPTIONS) as store:
        acked = _to_segment_end(store, "a")
    disk.full = True
    with RecordStore.open(path, disk=disk, options=OPTIONS) as store:  # opening needs no space
        assert len(store) == acked
    disk.full = False
    with RecordStore.open(path, disk=disk, options=OPTIONS) as store:
        store.transact_sync([Put("b", b"1")])
        assert len(store) == acked + 1


def test_an_interrupted_segment_creation_leaves_only_a_temporary(tmp_path: Path) -> None:
    """The slot is created under a temporary name: an interruption leaves no short .seg."""
    path, disk = str(tmp_path), FullDisk()
    with RecordStore.open(path, disk=disk, options=OPTIONS) as store:
        _to_segment_end(store, "a")
        real_rename = disk.rename
        seen: list[str] = []

        def spy(src: str, dst: str) -> None:
            seen.append(os.path.basename(src))
            real_rename(src, dst)

        disk.rename = spy  # type: ignore[method-assign]
        store.checkpoint_sync()
        for i in range(40):
            store.transact_sync([Put(f"c:{i}", b"x" * 1000)])
    assert any(".seg.tmp-" in name for name in seen)
    assert safe.is_temp_name(next(n for n in seen if ".seg.tmp-" in n))


@pytest.mark.anyio
async def test_service_answers_503_storage_full_with_retry_after_and_health_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx
    from _service import DETACHED_TOKEN, deadline
    from fakes.harness import make_config, running

    from afterword.http.metrics import ServiceCollector

    disk = FullDisk()
    monkeypatch.setattr(disk_root, "OsDisk", lambda: disk)  # the service's store opens on this disk
    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        await h.service.store.checkpoint()  # the next write starts a new segment life
        disk.full = True

        async def claim(key: str) -> httpx.Response:
            return await h.producer.client.post(
                f"{config.base_url}/v1/continuations/detached/claim",
                headers={
                    "Authorization": f"Bearer {DETACHED_TOKEN}",
                    "X-Mono-Agent-Service-Name": "work-control",
                },
                json={
                    "route": "verification",
                    "taskKey": key,
                    "taskHash": "h-" + key,
                    "deadline": deadline(),
                },
            )

        refused = await claim("t-1")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "storage_full"
        assert refused.headers["Retry-After"].isdigit()
        health = h.service.continuation_health()
        assert health.status == "unhealthy" and health.causes[0].code == "storage_full"
        metrics = {m.name: m for m in ServiceCollector(h.service).collect()}
        full = [
            s for s in metrics["afterword_storage_problem"].samples if s.labels["cause"] == "storage_full"
        ]
        assert full[0].value == 1
        disk.full = False
        accepted = await claim("t-1")  # the same request, retried once space is back
        assert accepted.status_code == 200, accepted.text
        assert h.service.continuation_health().causes == [] or all(
            c.code != "storage_full" for c in h.service.continuation_health().causes
        )


@pytest.mark.anyio
async def test_a_failed_fsync_is_503_disk_failed_without_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _service import DETACHED_TOKEN, deadline
    from fakes.harness import make_config, running

    disk = FullDisk()
    monkeypatch.setattr(disk_root, "OsDisk", lambda: disk)
    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        disk.eio = True
        answers = []
        for key in ("t-1", "t-2"):
            answers.append(
                await h.producer.client.post(
                    f"{config.base_url}/v1/continuations/detached/claim",
                    headers={
                        "Authorization": f"Bearer {DETACHED_TOKEN}",
                        "X-Mono-Agent-Service-Name": "work-control",
                    },
                    json={
                        "route": "verification",
                        "taskKey": key,
                        "taskHash": "h-" + key,
                        "deadline": deadline(),
                    },
                )
            )
        for answer in answers:  # the failing write, then a write refused by the failed store
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "disk_failed", answer.text
            assert "Retry-After" not in answer.headers
        health = h.service.continuation_health()
        assert health.status == "unhealthy" and health.causes[0].code == "disk_failed"
        disk.eio = False

"""examples/jobqueue: the second service on the durability layer, its rules and its HTTP routes."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/ is a top-level folder, not part of the installed package
    sys.path.insert(0, str(ROOT))

from afterword.disk import DiskFailedError  # noqa: E402
from afterword.store import Put, RecordStore  # noqa: E402
from examples.jobqueue.app import create_app  # noqa: E402
from examples.jobqueue.queue import PREFIX, JobQueue, LeaseLost, QueueCorrupt, QueueError, job_id  # noqa: E402

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def open_queue(state_dir: str, clock: Clock, **kw: int) -> JobQueue:
    return JobQueue.open(state_dir, clock=clock, **kw)


async def test_enqueue_is_idempotent_per_key_and_refuses_a_reused_key(state_dir: str) -> None:
    q = open_queue(state_dir, Clock())
    try:
        job, created = await q.enqueue("order-1", b"a")
        again, created_again = await q.enqueue("order-1", b"a")
        assert created and not created_again and again == job
        with pytest.raises(QueueError) as reused:
            await q.enqueue("order-1", b"b")
        with pytest.raises(QueueError) as large:
            await q.enqueue("big", b"x" * (64 * 1024 + 1))
        with pytest.raises(QueueError) as bad:
            await q.enqueue("", b"x")
        assert (reused.value.code, large.value.code, bad.value.code) == (
            "key_reused",
            "too_large",
            "invalid_request",
        )
        assert [j.key for j in q.list_jobs()] == ["order-1"]
    finally:
        q.close()


async def test_lease_ack_and_an_acked_job_never_comes_back(state_dir: str) -> None:
    clock = Clock()
    q = open_queue(state_dir, clock)
    try:
        await q.enqueue("a", b"1")
        clock.now += 1
        await q.enqueue("b", b"2")
        first = await q.lease(5_000)
        second = await q.lease(5_000)
        assert first and second and (first[0].key, second[0].key) == ("a", "b")
        assert await q.lease(5_000) is None  # both leased, neither expired
        done = await q.ack(first[0].id, first[1])
        assert done.state == "done" and done.payload == b""
        with pytest.raises(LeaseLost):
            await q.ack(first[0].id, first[1])  # settled already
        clock.now += 10**9
        again = await q.lease(5_000)
        assert again and again[0].key == "b"  # only the unacked one, even far in the future
        await q.enqueue("a", b"1")  # a late duplicate finds the tombstone: not a new job
        assert q.get(job_id("a")).state == "done"  # type: ignore[union-attr]
    finally:
        q.close()
    q = open_queue(state_dir, clock)
    try:
        assert {j.key: j.state for j in q.list_jobs()} == {"a": "done", "b": "leased"}
    finally:
        q.close()


async def test_an_expired_lease_is_offered_again_and_the_old_token_is_refused(state_dir: str) -> None:
    clock = Clock()
    q = open_queue(state_dir, clock)
    try:
        await q.enqueue("a", b"1")
        first = await q.lease(5_000)
        assert first is not None
        clock.now += 4_999
        assert await q.lease(5_000) is None
        clock.now += 1
        second = await q.lease(5_000)
        assert second is not None and second[0].id == first[0].id and second[0].attempts == 2
        with pytest.raises(LeaseLost):
            await q.ack(first[0].id, first[1])
        with pytest.raises(QueueError) as missing:
            await q.ack("0" * 32, 1)
        assert missing.value.code == "not_found"
        assert (await q.ack(second[0].id, second[1])).state == "done"
    finally:
        q.close()


async def test_nack_backs_off_then_dead_letters_after_the_last_attempt(state_dir: str) -> None:
    clock = Clock()
    q = open_queue(state_dir, clock, max_attempts=3, backoff_ms=1000)
    try:
        await q.enqueue("a", b"1")
        delays = []
        for _ in range(2):
            got = await q.lease(60_000)
            assert got is not None
            back = await q.nack(got[0].id, got[1], "boom")
            assert back.state == "ready" and back.error == "boom"
            delays.append(back.due_ms - clock.now)
            assert await q.lease(60_000) is None  # not before the backoff
            clock.now = back.due_ms
        assert delays == [1000, 2000]
        got = await q.lease(60_000)
        assert got is not None and got[0].attempts == 3 and got[0].error == "boom"
        dead = await q.nack(got[0].id, got[1], "still broken")
        assert dead.state == "dead" and dead.payload == b"1"
        assert [j.key for j in q.list_jobs("dead")] == ["a"]
    finally:
        q.close()


async def test_a_lease_that_expires_on_the_last_attempt_is_dead_lettered_with_the_next_lease(
    state_dir: str,
) -> None:
    clock = Clock()
    q = open_queue(state_dir, clock, max_attempts=1)
    try:
        await q.enqueue("a", b"1")
        assert await q.lease(1_000) is not None
        clock.now += 2_000  # past the lease
        await q.enqueue("b", b"2")
        lsn = q.store.statistics().next_lsn
        got = await q.lease(1_000)
        assert got is not None and got[0].key == "b"
        assert q.get(job_id("a")).state == "dead"  # type: ignore[union-attr]
        assert q.store.statistics().next_lsn == lsn + 1  # one transaction for both
    finally:
        q.close()


async def test_purge_forgets_done_tombstones_only(state_dir: str) -> None:
    clock = Clock()
    q = open_queue(state_dir, clock, max_attempts=2)
    try:
        for key in ("a", "b"):
            await q.enqueue(key, key.encode())
        a, b = await q.lease(1000), await q.lease(1000)
        assert a and b and (a[0].key, b[0].key) == ("a", "b")
        await q.nack(a[0].id, a[1], "once")
        clock.now += 10_000  # past a's backoff and b's lease
        a = await q.lease(1000)
        assert a is not None and a[0].key == "a" and a[0].error == "once"
        assert (await q.ack(a[0].id, a[1])).error == ""  # a done job carries no stale error
        b = await q.lease(1000)
        assert b is not None and b[0].key == "b" and b[0].attempts == 2
        await q.nack(b[0].id, b[1], "no")  # out of attempts: dead
        await q.enqueue("c", b"c")
        clock.now += 1
        assert await q.purge(clock.now) == 1
        assert {j.key: j.state for j in q.list_jobs()} == {"b": "dead", "c": "ready"}
        _, created = await q.enqueue("a", b"a")
        assert created  # the key is forgotten once its tombstone is purged
    finally:
        q.close()


async def test_concurrent_workers_each_get_a_different_job(state_dir: str) -> None:
    import anyio

    q = open_queue(state_dir, Clock())
    try:
        for i in range(20):
            await q.enqueue(f"j{i}", b"x")
        got: list[str] = []

        async def worker() -> None:
            while (lease := await q.lease(60_000)) is not None:
                got.append(lease[0].id)
                await q.ack(*[lease[0].id, lease[1]])

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(worker)
        assert sorted(got) == sorted(job_id(f"j{i}") for i in range(20))
        assert q.list_jobs("done") and not q.list_jobs("ready")
    finally:
        q.close()


async def test_an_undecodable_job_record_fails_closed(state_dir: str) -> None:
    with RecordStore.open(state_dir) as store:
        store.transact_sync([Put(PREFIX + "0" * 32, b"not msgpack of a job")])
    with pytest.raises(QueueCorrupt):
        open_queue(state_dir, Clock())


async def test_after_a_failed_write_the_queue_refuses_until_reopened(state_dir: str) -> None:
    q = open_queue(state_dir, Clock())
    try:
        await q.enqueue("a", b"1")
        q.store.root.fail(OSError(5, "injected"))
        with pytest.raises(DiskFailedError):
            await q.lease(1000)
        with pytest.raises(DiskFailedError):
            await q.enqueue("a", b"1")  # even an answer that needs no write
    finally:
        q.close()
    q = open_queue(state_dir, Clock())
    try:
        assert await q.lease(1000) is not None
    finally:
        q.close()


# -- HTTP ------------------------------------------------------------------------------------------
async def test_http_routes(state_dir: str) -> None:
    app = create_app(state_dir, clock=Clock())
    async with app.test_app() as test_app:
        client = test_app.test_client()
        r = await client.post("/jobs", json={"key": "k1", "payload": {"to": "x@example.org"}})
        assert r.status_code == 201
        job = await r.get_json()
        assert job["state"] == "ready" and job["payload"] == {"to": "x@example.org"}
        r = await client.post("/jobs", json={"key": "k1", "payload": {"to": "x@example.org"}})
        assert r.status_code == 200
        r = await client.post("/jobs", json={"key": "k1", "payload": 2})
        assert r.status_code == 409 and (await r.get_json())["error"]["code"] == "key_reused"

        r = await client.post("/leases", json={"leaseSeconds": 30})
        lease = await r.get_json()
        assert r.status_code == 200 and lease["job"]["id"] == job["id"] and lease["job"]["attempts"] == 1
        assert (await client.post("/leases", json={})).status_code == 204
        ack = f"/jobs/{job['id']}/ack"
        r = await client.post(ack, json={"leaseToken": lease["leaseToken"] + 1})
        assert r.status_code == 409 and (await r.get_json())["error"]["code"] == "lease_lost"
        r = await client.post(ack, json={"leaseToken": lease["leaseToken"]})
        assert r.status_code == 200 and (await r.get_json())["state"] == "done"
        r = await client.get("/jobs?state=done")
        assert [j["id"] for j in (await r.get_json())["items"]] == [job["id"]]

        r = await client.post("/jobs/" + "0" * 32 + "/nack", json={"leaseToken": 1})
        assert r.status_code == 404 and (await r.get_json())["error"]["code"] == "not_found"
        for path, body in (
            ("/jobs", {"key": "k2"}),
            ("/jobs", {"key": "k2", "payload": 1, "extra": 1}),
            ("/leases", {"leaseSeconds": 0}),
            ("/leases", {"leaseSeconds": "x"}),
        ):
            r = await client.post(path, json=body)
            assert r.status_code == 400, (path, body)
            assert (await r.get_json())["error"]["code"] == "invalid_request"
        r = await client.post("/jobs", data=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert (await client.get("/jobs?state=nope")).status_code == 400
    # the routes held the store open; it is closed again after serving
    with RecordStore.open(state_dir) as store:
        assert len(list(store.items(PREFIX))) == 1
        assert msgspec.msgpack.decode(next(store.items(PREFIX)).value)["state"] == "done"


async def test_http_answers_503_once_the_disk_failed(state_dir: str) -> None:
    import errno

    from afterword.disk import OsDisk

    class DyingDisk(OsDisk):
        dead = False

        def fdatasync(self, fd: int) -> None:
            if self.dead:
                raise OSError(errno.EIO, "injected")
            super().fdatasync(fd)

    disk = DyingDisk()
    app = create_app(state_dir, clock=Clock(), disk=disk)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        assert (await client.post("/jobs", json={"key": "a", "payload": 1})).status_code == 201
        disk.dead = True
        for key in ("b", "a"):  # the failing write, then a refusal even of a repeat
            r = await client.post("/jobs", json={"key": key, "payload": 1})
            assert r.status_code == 503 and (await r.get_json())["error"]["code"] == "unavailable"
        assert (await client.get("/jobs")).status_code == 200  # reads still answer

"""The service follows a loopback HTTP server's MCP task itself: the real service (with the
follower ``open_service`` starts), a real Tasks server on the SDK 2.x extension API
(tests/tasks_servers/inproc_sdk_server.py), and the real SDK client in between.

Two ways of driving it: the running service (its own follower, real time, woken by the
change signal) for completion, restart and cancel; and a follower stepped by the test on the
service's clock (``refresh``/``poll_due``) for the timing rows, so no test waits a backoff out.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from _taskfollow import require_sdk2

require_sdk2()

import anyio  # noqa: E402
import pytest  # noqa: E402
from _cli import Server  # noqa: E402
from _service import ENV, outbox_lines, write_config  # noqa: E402
from tasks_servers.inproc_sdk_server import TaskBook, serving  # noqa: E402
from test_host_binding import CONV, ORIGIN, REPLY  # noqa: E402
from test_http_protocol import Clock  # noqa: E402

import afterword  # noqa: E402
from afterword.app.service import ContinuationService, wall_clock_ms  # noqa: E402
from afterword.clients.hostapi_client import HostClient  # noqa: E402
from afterword.clients.operator import read_host_token  # noqa: E402
from afterword.protocol.tasks import TaskHandle  # noqa: E402
from afterword.worker import compose  # noqa: E402
from afterword.worker.taskfollow import TaskFollower, load_wire  # noqa: E402
from afterword.worker.taskwire import McpTaskWire  # noqa: E402

pytestmark = pytest.mark.anyio
WEB = "web-tasks"


class Frozen:
    """The service's clock for a stepped test: it moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = wall_clock_ms()

    def __call__(self) -> int:
        return self.now


@asynccontextmanager
async def service_for(
    root: Path,
    url: str,
    *,
    run_worker: bool = True,
    clock: Callable[[], int] | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[ContinuationService]:
    server: dict[str, Any] = {"url": url, **({"headers": headers} if headers else {})}
    path = write_config(root, servers={WEB: server}, selected=[WEB])
    config = afterword.load_config(path, environ=ENV)
    async with afterword.open_service(
        config, run_worker=run_worker, environ=ENV, clock_ms=clock or Clock()
    ) as service:
        yield service


async def adopt(
    service: ContinuationService, task_id: str, *, hint: int | None = None, ttl: int | None = None
) -> str:
    run = service.begin_run(f"run-{task_id}", CONV, REPLY)
    adopted = await run.adopt_task(
        WEB, TaskHandle(task_id=task_id, status="working", poll_interval_ms=hint, ttl_ms=ttl)
    )
    assert adopted.follow == "service"
    await run.finalize(ORIGIN)
    await run.activate()
    return adopted.continuation_id


def record(service: ContinuationService, cid: str) -> Any:
    return service.repo.get(cid) or service.repo.tombstone(cid)


async def until(
    service: ContinuationService, cid: str, done: Callable[[Any], bool], timeout: float = 20
) -> Any:
    """Wait, on the service's change signal, until the record satisfies ``done``."""
    with anyio.fail_after(timeout):
        while not done(rec := record(service, cid)):
            await service.work_available.wait(0.05)
    return rec


def stepped(service: ContinuationService) -> TaskFollower:
    wire = load_wire()
    assert wire is not None
    return TaskFollower(
        service,
        wire,
        mcp_servers=service.config.mcp_servers,
        limiter=anyio.CapacityLimiter(4),
        clock_ms=service.clock_ms,
        jitter=lambda: 0.0,
    )


async def step_to_next(follower: TaskFollower, clock: Frozen) -> list[str]:
    due = follower.next_due_ms()
    assert due is not None
    clock.now = max(clock.now, due)
    follower.refresh()
    return await follower.poll_due()


def task_cause(rec: Any) -> str | None:
    return rec.last_error.code if rec.last_error is not None else None


# -- the running service ------------------------------------------------------------------------
async def test_a_task_completing_while_followed_is_answered_once(tmp_path: Path) -> None:
    book = TaskBook()
    task_id = book.new(poll_interval_ms=0)
    async with serving(book) as url, service_for(tmp_path, url) as service:
        cid = await adopt(service, task_id, hint=0)
        with anyio.fail_after(20):
            await book.polls(1)  # followed at once, without a request naming the server
        book.complete(task_id, "42 rows indexed", {"rows": 42})
        rec = await until(service, cid, lambda r: r.state == "delivered")
        config = service.config
    lines = [line for line in outbox_lines(config) if line["deliveryKey"].startswith(cid + ":")]
    assert len(lines) == 1 and lines[0]["conversationId"] == REPLY
    assert "42" in lines[0]["text"]
    assert rec.result is not None and rec.task.status == "completed"
    assert set(book.declared) == {True}  # every tasks/get declared the tasks extension


async def test_a_task_that_finished_while_the_service_was_down_is_polled_at_once(tmp_path: Path) -> None:
    book = TaskBook()
    task_id = book.new(poll_interval_ms=60_000)  # a minute between polls: only a start polls sooner
    async with serving(book) as url:
        async with service_for(tmp_path, url) as service:
            cid = await adopt(service, task_id, hint=60_000)
            with anyio.fail_after(20):
                await book.polls(1)
        polls_before = len(book.gets)
        book.complete(task_id, "backup finished", {"backup": "ok"})  # afterword is down
        async with service_for(tmp_path, url) as service:
            rec = await until(service, cid, lambda r: r.state == "delivered")
    assert len(book.gets) == polls_before + 1 and rec.result is not None


async def test_operator_cancel_sends_tasks_cancel_once(tmp_path: Path) -> None:
    book = TaskBook()
    task_id = book.new(poll_interval_ms=60_000)
    async with serving(book) as url, service_for(tmp_path, url) as service:
        cid = await adopt(service, task_id, hint=60_000)
        with anyio.fail_after(20):
            await book.polls(1)
        await service.cancel_continuation(cid)
        rec = await until(service, cid, lambda r: r.task.cancel_sent_at_ms is not None)
        assert service.tasks_to_follow() == []
    assert book.cancels == [task_id] and book.tasks[task_id].status == "cancelled"
    assert rec.state == "cancelled" and rec.task.cancel_ok is True


async def test_unreachable_until_the_deadline_expires_and_owes_a_cancel(tmp_path: Path) -> None:
    book = TaskBook()
    task_id = book.new()
    book.hostile = "error_500"  # up, answering every poll with a failure
    clock = Clock()
    async with serving(book) as url, service_for(tmp_path, url, clock=clock) as service:
        cid = await adopt(service, task_id, ttl=60_000)
        with anyio.fail_after(20):
            await book.polls(1)
        assert record(service, cid).state == "claimed"  # failures do not end it: the deadline does
        clock.offset_ms += 61_000
        service.work_available.set()
        rec = await until(
            service, cid, lambda r: r.state == "expired" and r.task.cancel_sent_at_ms is not None
        )
    assert book.cancels == [task_id] and rec.task.cancel_ok is True


async def test_a_server_that_never_listens_leaves_the_deadline_to_expire_it(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/mcp"
        clock = Clock()
        async with service_for(tmp_path, url, clock=clock) as service:
            cid = await adopt(service, "task-1", ttl=60_000)
            clock.offset_ms += 61_000
            service.work_available.set()
            rec = await until(
                service, cid, lambda r: r.state == "expired" and r.task.cancel_sent_at_ms is not None
            )
    assert rec.last_error is not None and rec.last_error.code == "expired"
    assert rec.task.cancel_ok is False and "ConnectError" in rec.task.cancel_detail


# -- stepped on the service's clock -----------------------------------------------------------
async def test_a_refused_cancel_is_recorded_and_not_sent_again(tmp_path: Path) -> None:
    book = TaskBook()
    task_id = book.new()
    async with serving(book) as url, service_for(tmp_path, url, run_worker=False) as service:
        cid = await adopt(service, task_id)
        follower = stepped(service)
        follower.refresh()
        await follower.poll_due()
        book.lose_all()  # the server will not know the task it is asked to cancel
        await service.cancel_continuation(cid)
        follower.refresh()
        await follower.poll_due()
        rec = record(service, cid)
        follower.refresh()
        assert await follower.poll_due() == [] and service.tasks_to_follow() == []
    assert book.cancels == [task_id]
    assert rec.state == "cancelled" and rec.task.cancel_ok is False  # the cancel stands
    assert "not found" in rec.task.cancel_detail


@pytest.mark.parametrize(("hint", "delay"), [(0, 250), (10**9, 60_000)])
async def test_a_hostile_poll_interval_is_clamped(tmp_path: Path, hint: int, delay: int) -> None:
    book = TaskBook()
    task_id = book.new(poll_interval_ms=hint)
    clock = Frozen()
    async with serving(book) as url, service_for(tmp_path, url, run_worker=False, clock=clock) as service:
        cid = await adopt(service, task_id)
        follower = stepped(service)
        follower.refresh()
        assert await follower.poll_due() == [cid]
        assert follower.next_due_ms() == clock() + delay
        clock.now += delay - 1
        assert await follower.poll_due() == []
        assert await step_to_next(follower, clock) == [cid]
        rec = record(service, cid)
        assert rec.state == "claimed" and rec.task.reported_at_ms is None  # working: nothing durable
    assert len(book.gets) == 2


@pytest.mark.parametrize(
    ("status", "state", "cause"),
    [
        ("cancelled", "cancelled", "task_cancelled"),
        ("input_required", "dead_lettered", "task_input_required"),
        ("failed", "result_received", "task_failed"),  # a result telling the user it failed
    ],
)
async def test_what_the_server_says_ends_the_continuation(
    tmp_path: Path, status: str, state: str, cause: str
) -> None:
    book = TaskBook()
    task_id = book.new(status=status, message="needs a person" if status != "cancelled" else None)
    async with serving(book) as url, service_for(tmp_path, url, run_worker=False) as service:
        cid = await adopt(service, task_id)
        follower = stepped(service)
        follower.refresh()
        await follower.poll_due()
        rec = record(service, cid)
        assert rec.state == state and task_cause(rec) == cause
        assert service.tasks_to_follow() == []
    # Only a task that asked for input is cancelled by afterword (the intent was durable first).
    assert book.cancels == ([task_id] if status == "input_required" else [])
    if status == "input_required":
        assert rec.task.cancel_ok is True and rec.task.cancel_sent_at_ms is not None


async def test_a_task_the_server_lost_is_dead_lettered_and_shown_in_health(tmp_path: Path) -> None:
    book = TaskBook()
    task_id = book.new()
    async with serving(book) as url, service_for(tmp_path, url, run_worker=False) as service:
        cid = await adopt(service, task_id)
        book.lose_all()  # the server restarted with an in-memory backend
        follower = stepped(service)
        follower.refresh()
        await follower.poll_due()
        rec = record(service, cid)
        health = service.continuation_health()
    assert rec.state == "dead_lettered" and task_cause(rec) == "task_lost"
    assert [c.code for c in health.causes if c.code == "task_lost"] == ["task_lost"]


@pytest.mark.parametrize("hostile", ["wrong_id", "malformed"])
async def test_five_broken_answers_in_a_row_end_as_a_protocol_error(tmp_path: Path, hostile: str) -> None:
    book = TaskBook()
    task_id = book.new(poll_interval_ms=0)
    book.hostile = hostile  # type: ignore[assignment]
    clock = Frozen()
    async with serving(book) as url, service_for(tmp_path, url, run_worker=False, clock=clock) as service:
        cid = await adopt(service, task_id)
        follower = stepped(service)
        follower.refresh()
        await follower.poll_due()
        for _ in range(3):
            await step_to_next(follower, clock)
        assert record(service, cid).state == "claimed"  # four broken answers: still waiting
        await step_to_next(follower, clock)
        rec = record(service, cid)
    assert len(book.gets) == 5
    assert rec.state == "dead_lettered" and task_cause(rec) == "task_protocol_error"


async def test_a_huge_answer_is_dead_lettered_too_large_without_being_read(tmp_path: Path) -> None:
    book = TaskBook(huge_bytes=16 * 1024 * 1024)
    task_id = book.new()
    book.hostile = "huge"
    async with serving(book) as url, service_for(tmp_path, url, run_worker=False) as service:
        cid = await adopt(service, task_id)
        follower = stepped(service)
        follower.refresh()
        await follower.poll_due()
        rec = record(service, cid)
    assert rec.state == "dead_lettered" and task_cause(rec) == "task_result_too_large"


async def test_configured_headers_are_sent_and_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "Bearer s3cr3t-0123456789"
    book = TaskBook()
    task_id = book.new(poll_interval_ms=0)
    book.hostile = "malformed"
    clock = Frozen()
    caplog.set_level(logging.DEBUG)
    async with (
        serving(book) as url,
        service_for(
            tmp_path, url, run_worker=False, clock=clock, headers={"Authorization": secret}
        ) as service,
    ):
        cid = await adopt(service, task_id)
        follower = stepped(service)
        follower.refresh()
        await follower.poll_due()
        book.hostile = "error_500"
        await step_to_next(follower, clock)
        await service.cancel_continuation(cid)
        follower.refresh()
        await follower.poll_due()  # tasks/cancel
    assert [h.get("authorization") for h in book.headers] == [secret, secret]
    assert book.cancels == [task_id]
    assert caplog.records and secret not in caplog.text and "s3cr3t" not in caplog.text


@pytest.mark.parametrize("secret", ["Bearer s3cr3t-0123456789", "opaque-key-42"])
async def test_a_server_echoing_its_credentials_gets_them_redacted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, secret: str
) -> None:
    book = TaskBook()
    lost, refusing = book.new(), book.new()
    book.hostile = "echo"
    caplog.set_level(logging.DEBUG)
    headers = {"Authorization": secret}
    async with serving(book) as url, service_for(tmp_path, url, run_worker=False, headers=headers) as service:
        lost_cid = await adopt(service, lost)
        cancel_cid = await adopt(service, refusing)
        await service.cancel_continuation(cancel_cid)  # before any poll: only the cancel goes
        follower = stepped(service)
        follower.refresh()
        await follower.poll_due()
        gone, cancelled = record(service, lost_cid), record(service, cancel_cid)
    assert book.cancels == [refusing] and book.gets == [lost]
    assert gone.state == "dead_lettered" and task_cause(gone) == "task_lost"
    assert "[redacted]" in gone.last_error.message and "[redacted]" in cancelled.task.cancel_detail
    token = secret.split()[-1]
    assert token not in gone.last_error.message and token not in cancelled.task.cancel_detail
    assert token not in caplog.text


async def test_afterword_serve_follows_a_task_a_remote_host_adopted(tmp_path: Path) -> None:
    """The served process runs the follower too: a host adopts over the host API, and the
    answer reaches the outbox with no host left polling."""
    book = TaskBook()
    task_id = book.new(poll_interval_ms=0)
    async with serving(book) as url:
        path = write_config(tmp_path, servers={WEB: {"url": url}}, selected=[WEB])
        served = Server(path)
        await anyio.to_thread.run_sync(served.start)
        try:
            config = afterword.load_config(path, environ=ENV)
            async with HostClient(served.base, read_host_token(config)) as host:
                run = await host.begin_run("run-served", CONV, REPLY)
                adopted = await run.adopt_task(WEB, TaskHandle(task_id=task_id, status="working"))
                await run.finalize(ORIGIN)
                await run.activate()
            assert adopted.follow == "service"
            with anyio.fail_after(30):
                await book.polls(1)
                book.complete(task_id, "served answer 7", {"answer": 7})
                while not [
                    x for x in outbox_lines(config) if x["deliveryKey"].startswith(adopted.continuation_id)
                ]:
                    await anyio.sleep(0.05)  # another process: watched, not signalled
        finally:
            assert await anyio.to_thread.run_sync(served.stop) == 0
    (line,) = [x for x in outbox_lines(config) if x["deliveryKey"].startswith(adopted.continuation_id)]
    assert line["conversationId"] == REPLY and "7" in line["text"]


# -- wiring ---------------------------------------------------------------------------------------
async def test_the_follower_starts_only_with_an_http_server_and_the_sdk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with service_for(tmp_path, "http://127.0.0.1:9/mcp", run_worker=False) as service:
        worker = service.worker  # type: ignore[attr-defined]
        follower = compose.attach_task_follower(service, worker)
        assert follower is not None and isinstance(follower.wire, McpTaskWire)
        assert follower.limiter is worker.limiter  # polls share the worker's bound
        monkeypatch.setattr(compose, "load_wire", lambda: None)  # the SDK 2.x line is missing
        assert compose.attach_task_follower(service, worker) is None

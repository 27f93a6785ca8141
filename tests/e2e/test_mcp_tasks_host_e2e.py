"""The host side of the MCP Tasks bridge end to end: the host helpers (``connect_servers`` with
a ``TaskHost``), a real SDK 2.x Tasks server (tests/tasks_servers/host_tasks_server.py), and the
real service, both ways of being a host (the in-process handle, and the host API over loopback
HTTP through ``HostClient``/``RemoteRun``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from _cli import Server
from _service import free_port, load, write_config
from test_host_binding import CONV, ORIGIN, REPLY
from test_host_parity import Host, hosting
from test_mcp_e2e import wait_port

from afterword.cli import main as cli_main
from afterword.clients.hostapi_client import HostClient
from afterword.clients.mcp_sdk import installed_line
from afterword.continuations.jcs import canonical_json
from afterword.protocol.tasks import TaskHandle, TaskOutcome

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        installed_line() != 2,
        reason="the MCP tasks extension needs the SDK 2.x client extension API; 1.x declares nothing",
    ),
]

if installed_line() == 2:
    from afterword.mcp_host import TaskHost, call_tool, connect_servers, settle_run, tool_outcome

SERVER_PY = str(Path(__file__).resolve().parents[1] / "tasks_servers" / "host_tasks_server.py")
SERVER = "work-control"  # selected, over stdio: its tasks are followed by the host
WEB = "web-tasks"  # selected, over loopback HTTP: its tasks are followed by the service
WAIT_S = 30.0


def args(root: Path, name: str) -> list[str]:
    return [SERVER_PY, "--record", str(root / f"{name}.jsonl"), "--gates", str(root / "gates")]


def records(root: Path, name: str) -> list[dict[str, Any]]:
    path = root / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def web(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "gates").mkdir(exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, *args(tmp_path, WEB), "--http", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(proc, port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(params=["embedded", "http"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    (tmp_path / "gates").mkdir(exist_ok=True)

    def make(web_url: str | None = None, **kw: Any) -> Any:
        servers: dict[str, Any] = {SERVER: {"command": sys.executable, "args": args(tmp_path, SERVER)}}
        if web_url is not None:
            servers[WEB] = {"url": web_url}
        return hosting(request.param, tmp_path, servers=servers, selected=list(servers), **kw)

    return make


def reporter(x: Host) -> Any:
    """Who hears host-followed outcomes: the service embedded, the host API's client over HTTP."""
    return x.h.service if x.client is None else x.client


@asynccontextmanager
async def task_turn(x: Host, tasks: TaskHost, run: Any, names: list[str]) -> AsyncIterator[dict[str, Any]]:
    async with connect_servers(run, x.h.config, names, tasks=tasks) as sessions:
        yield sessions


async def wait_record(x: Host, cid: str, state: str) -> Any:
    with anyio.fail_after(WAIT_S):
        while (rec := x.h.service.repo.get(cid)) is None or rec.state != state:
            await x.h.service.work_available.wait(0.05)
    return rec


def opened(root: Path, key: str, text: str = "ok") -> None:
    (root / "gates" / key).write_text(text)


async def test_a_stdio_task_is_adopted_for_the_run_followed_by_the_host_and_answered_once(
    host: Callable[..., Any], tmp_path: Path
) -> None:
    async with host(run_worker=True) as x, TaskHost(reporter(x)) as tasks:
        run = await x.begin()
        async with task_turn(x, tasks, run, [SERVER]) as sessions:
            result = await call_tool(sessions[SERVER], "job", {"key": "idx", "text": "reindex"})
        outcome = tool_outcome(result)
        assert not outcome.failed, outcome.text
        (cid,) = [rec.id for rec in x.h.service.repo.live()]
        assert f"continuation {cid}" in outcome.text and "will follow in this conversation" in outcome.text
        rec = x.h.service.repo.get(cid)
        assert rec is not None and rec.task is not None
        # Bound exactly like a claim of this run: run, server, route, mode; followed by the host.
        assert (rec.claim.run_id, rec.claim.conversation_id, rec.claim.reply_to) == ("run-1", CONV, REPLY)
        assert rec.claim.mode == "reply" and rec.task.follow == "host"
        assert rec.task.task_id not in outcome.text  # the model never reads the server's task id
        assert tasks.following == {cid}  # the turn is over; its stdio session is still polled
        await settle_run(run, ORIGIN)
        opened(tmp_path, "idx")
        rec = await wait_record(x, cid, "delivered")
        assert rec.result is not None and rec.result.idempotency_key == f"task:{rec.task.task_id}"
        assert rec.result.payload == canonical_json({"job": "reindex", "finished": True})
        assert rec.origin_context == "pinned"
        with anyio.fail_after(WAIT_S):
            while tasks.following:
                await anyio.sleep(0.02)
        (request,) = x.h.synth.requests  # answered once
        assert request.conversation_id == CONV
    assert {r["method"] for r in records(tmp_path, SERVER)} == {"tools/call", "tasks/get"}
    assert records(tmp_path, SERVER)[0]["declared"] is True


async def test_a_loopback_http_task_is_left_to_the_service(
    host: Callable[..., Any], tmp_path: Path, web: str
) -> None:
    async with host(web_url=web) as x, TaskHost(reporter(x)) as tasks:
        run = await x.begin()
        async with task_turn(x, tasks, run, [WEB]) as sessions:
            outcome = tool_outcome(await call_tool(sessions[WEB], "job", {"key": "w", "text": "backup"}))
            assert not outcome.failed, outcome.text
            assert tasks.following == frozenset()  # the host polls nothing
        (rec,) = x.h.service.repo.live()
        assert rec.task is not None and rec.task.follow == "service" and rec.claim.server_name == WEB
        assert rec.claim.run_id == "run-1"
        await settle_run(run, ORIGIN)
    assert tasks.reported == 0
    assert records(tmp_path, WEB)[0]["declared"] is True


async def test_a_malformed_handle_reaches_the_model_as_an_error_and_adopts_nothing(
    host: Callable[..., Any],
) -> None:
    async with host() as x, TaskHost(reporter(x)) as tasks:
        run = await x.begin()
        async with task_turn(x, tasks, run, [SERVER]) as sessions:
            bad = [
                tool_outcome(await call_tool(sessions[SERVER], "malformed", {"kind": k}))
                for k in ("control", "long")
            ]
        assert all(o.failed and "malformed task handle" in o.text for o in bad)
        assert list(x.h.service.repo.live()) == []
        assert (await x.call("list_continuations")).items == []
        await settle_run(run, ORIGIN)


async def test_a_cancel_reaches_the_server_through_the_hosts_next_report(
    host: Callable[..., Any], tmp_path: Path
) -> None:
    async with host() as x, TaskHost(reporter(x)) as tasks:
        run = await x.begin()
        async with task_turn(x, tasks, run, [SERVER]) as sessions:
            await call_tool(sessions[SERVER], "job", {"key": "c", "text": "x"})
        (cid,) = tasks.following
        await settle_run(run, ORIGIN)
        assert (await x.call("cancel_continuation", cid)).state == "cancelled"
        with anyio.fail_after(WAIT_S):
            while tasks.following:
                await anyio.sleep(0.02)
        assert tasks.cancels_sent == 1
        rec = x.h.service.repo.get(cid)
        assert rec is not None and rec.state == "cancelled"
    assert [r["method"] for r in records(tmp_path, SERVER)][-1] == "tasks/cancel"


async def test_a_host_that_exits_first_leaves_the_task_visibly_dead_lettered(
    host: Callable[..., Any], tmp_path: Path
) -> None:
    async with host(limits={"taskHostLeaseMs": 1000}) as x:
        async with TaskHost(reporter(x)) as tasks:
            run = await x.begin()
            async with task_turn(x, tasks, run, [SERVER]) as sessions:
                await call_tool(sessions[SERVER], "job", {"key": "gone", "text": "x"})
            (cid,) = tasks.following
            await settle_run(run, ORIGIN)
        # The host is gone (its TaskHost, and with it the stdio server): nobody reports.
        opened(tmp_path, "gone")  # the task would finish now, but no one is left to see it
        rec = await wait_record(x, cid, "dead_lettered")
        assert rec.last_error is not None and rec.last_error.code == "task_host_gone"
        health = await x.call("continuation_health")
        assert health.status == "unhealthy"


async def test_answers_about_another_task_end_as_a_protocol_error(tmp_path: Path) -> None:
    """Five malformed ``tasks/get`` answers in a row (here: about another task id): the host
    reports ``protocol_error`` and the continuation is dead-lettered with that cause."""
    (tmp_path / "gates").mkdir()
    servers = {SERVER: {"command": sys.executable, "args": args(tmp_path, SERVER)}}
    async with hosting("embedded", tmp_path, servers=servers, selected=[SERVER]) as x:
        async with TaskHost(x.h.service) as tasks:
            run = await x.begin()
            async with task_turn(x, tasks, run, [SERVER]) as sessions:
                await call_tool(sessions[SERVER], "job", {"key": "w", "text": "x", "wrong_id": True})
            (cid,) = tasks.following
            await settle_run(run, ORIGIN)
            rec = await wait_record(x, cid, "dead_lettered")
        assert rec.last_error is not None and rec.last_error.code == "task_protocol_error"
    assert [r["method"] for r in records(tmp_path, SERVER)].count("tasks/get") == 5


async def test_a_result_too_large_ends_visibly(host: Callable[..., Any], tmp_path: Path) -> None:
    """5 MiB of result: embedded, the service's payload limit dead-letters it; over HTTP the
    report is past the route's body limit (413), so the host reports ``too_large`` instead.
    Either way the continuation ends ``task_result_too_large`` and nothing is delivered."""
    async with host() as x, TaskHost(reporter(x)) as tasks:
        run = await x.begin()
        async with task_turn(x, tasks, run, [SERVER]) as sessions:
            await call_tool(sessions[SERVER], "job", {"key": "big", "text": "x", "pad": 5 * 1024 * 1024})
        (cid,) = tasks.following
        await settle_run(run, ORIGIN)
        opened(tmp_path, "big")
        rec = await wait_record(x, cid, "dead_lettered")
        assert rec.last_error is not None and rec.last_error.code == "task_result_too_large"
        assert x.h.synth.requests == []


async def test_the_host_keeps_following_across_a_sidecar_restart(tmp_path: Path) -> None:
    """A host-followed task, with ``afterword serve`` as a sidecar that restarts while the task
    runs: the host's reports fail while it is down and are retried; after the restart the task
    gets a fresh lease, and its answer is delivered once."""
    (tmp_path / "gates").mkdir()
    config_path = write_config(
        tmp_path, servers={SERVER: {"command": sys.executable, "args": args(tmp_path, SERVER)}}
    )
    token_file = tmp_path / "host.token"
    server = Server(config_path)
    server.start()
    try:
        assert (
            cli_main(["continuations", "host-token", "--config", str(config_path), "--file", str(token_file)])
            == 0
        )
        config = load(config_path)
        async with HostClient(server.base, token_file.read_text()) as client, TaskHost(client) as tasks:
            run = await client.begin_run("run-restart", CONV, REPLY)
            async with connect_servers(run, config, [SERVER], tasks=tasks) as sessions:  # type: ignore[arg-type]
                outcome = tool_outcome(
                    await call_tool(sessions[SERVER], "job", {"key": "r", "text": "restart"})
                )
            assert not outcome.failed, outcome.text
            (cid,) = tasks.following
            await settle_run(run, ORIGIN)  # type: ignore[arg-type]
            reported = tasks.reported
            server.stop()

            def polls() -> int:
                return sum(r["method"] == "tasks/get" for r in records(tmp_path, SERVER))

            seen = polls()
            with anyio.fail_after(WAIT_S):  # the host polls on while the service is down...
                while polls() < seen + 2:
                    await anyio.sleep(0.05)
            assert tasks.reported == reported  # ...and none of those reports got through
            server.start()
            opened(tmp_path, "r")
            with anyio.fail_after(WAIT_S):
                while tasks.following:
                    await anyio.sleep(0.05)
            outbox = config_path.parent / "outbox.jsonl"
            with anyio.fail_after(WAIT_S):
                while not outbox.exists() or not outbox.read_text().strip():
                    await anyio.sleep(0.05)
                while (await client.list_continuations()).items[0].state != "delivered":
                    await anyio.sleep(0.05)
        lines = [json.loads(x) for x in outbox.read_text().splitlines() if x.strip()]
        assert [(line["conversationId"], line["deliveryKey"].split(":")[0]) for line in lines] == [
            (REPLY, cid)
        ]
    finally:
        if server.proc is not None:
            server.stop()


async def test_a_stdio_server_that_dies_leaves_its_task_to_the_host_lease(
    host: Callable[..., Any], tmp_path: Path
) -> None:
    """The server process (and the task state in it) is gone while the host lives: the host
    stops following that task, keeps serving, and the service dead-letters it task_host_gone."""
    async with host(limits={"taskHostLeaseMs": 1000}) as x, TaskHost(reporter(x)) as tasks:
        run = await x.begin()
        async with task_turn(x, tasks, run, [SERVER]) as sessions:
            await call_tool(sessions[SERVER], "job", {"key": "dies", "text": "x"})
        (cid,) = tasks.following
        await settle_run(run, ORIGIN)
        os.kill(int((tmp_path / f"{SERVER}.jsonl.pid").read_text()), signal.SIGKILL)
        with anyio.fail_after(WAIT_S):
            while tasks.following:
                await anyio.sleep(0.05)
        rec = await wait_record(x, cid, "dead_lettered")
        assert rec.last_error is not None and rec.last_error.code == "task_host_gone"
        # The TaskHost itself is unharmed: the next turn starts a new server and adopts again.
        run2 = await x.begin("run-2")
        async with task_turn(x, tasks, run2, [SERVER]) as sessions:
            outcome = tool_outcome(await call_tool(sessions[SERVER], "job", {"key": "next", "text": "y"}))
        assert not outcome.failed and len(tasks.following) == 1
        await settle_run(run2, ORIGIN)


async def test_a_claim_token_echoed_by_the_server_never_reaches_the_record(
    host: Callable[..., Any], tmp_path: Path
) -> None:
    async with host(run_worker=True) as x, TaskHost(reporter(x)) as tasks:
        run = await x.begin()
        token = run.stdio_env(SERVER, {})["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]
        async with task_turn(x, tasks, run, [SERVER]) as sessions:
            await call_tool(sessions[SERVER], "job", {"key": "echo", "text": "x", "echo": True})
        (cid,) = tasks.following
        await settle_run(run, ORIGIN)
        opened(tmp_path, "echo", "fail")
        rec = await wait_record(x, cid, "delivered")
        assert rec.result is not None
        assert b"echo broke with token [redacted]" in rec.result.payload
        assert token.encode() not in rec.result.payload
        assert all(token not in str(m) for m in x.h.synth.requests)


async def test_an_answer_the_host_api_refuses_ends_as_a_protocol_error(tmp_path: Path) -> None:
    """A result nested deeper than the host API takes is refused (400): the host says so with
    ``protocol_error`` instead of falling silent, which would leave the record to wait out the
    host lease and end as ``task_host_gone``, blaming the wrong party."""
    servers = {SERVER: {"command": sys.executable, "args": args(tmp_path, SERVER)}}
    async with (
        hosting("http", tmp_path, servers=servers, selected=[SERVER]) as x,
        TaskHost(reporter(x)) as tasks,
    ):
        run = await x.begin()
        cid = (await run.adopt_task(SERVER, TaskHandle(task_id="t-deep", status="working"))).continuation_id
        deep: dict[str, Any] = {}
        inner = deep
        for _ in range(100):
            inner["a"] = {}
            inner = inner["a"]
        outcome = TaskOutcome(status="completed", result={"content": [], "structuredContent": deep})
        report = await tasks._report(cid, outcome)
        assert report is not None and report.state == "dead_lettered"
        rec = x.h.service.repo.get(cid)
        assert rec is not None and rec.last_error is not None
        assert rec.last_error.code == "task_protocol_error" and "nests deeper" in rec.last_error.message


async def test_a_sidecar_killed_right_after_a_completed_report_answers_it_once(tmp_path: Path) -> None:
    """SIGKILL of ``afterword serve`` as soon as a completed report was answered: the result
    was durable before the answer, so the restarted service answers it, once; the host, which
    repeats its report (it cannot know the answer reached it in time), changes nothing."""
    config_path = write_config(
        tmp_path, servers={SERVER: {"command": sys.executable, "args": ["-c", "pass"]}}
    )
    token_file = tmp_path / "host.token"
    server = Server(config_path)
    server.start()
    try:
        assert (
            cli_main(["continuations", "host-token", "--config", str(config_path), "--file", str(token_file)])
            == 0
        )
        outbox = config_path.parent / "outbox.jsonl"
        async with HostClient(server.base, token_file.read_text()) as client:
            run = await client.begin_run("run-kill", CONV, REPLY)
            cid = (
                await run.adopt_task(SERVER, TaskHandle(task_id="t-kill", status="working"))
            ).continuation_id
            await settle_run(run, ORIGIN)  # type: ignore[arg-type]
            first = TaskOutcome(
                status="completed", result={"content": [{"type": "text", "text": "first answer"}]}
            )
            assert (await client.report_task_outcome(cid, first)).state != "claimed"
            server.stop(signal.SIGKILL)
            server.start()
            second = TaskOutcome(
                status="completed", result={"content": [{"type": "text", "text": "second answer"}]}
            )
            again = await client.report_task_outcome(cid, second)
            assert again.state != "claimed" and again.cancel is False
            with anyio.fail_after(WAIT_S):
                while (await client.list_continuations()).items[0].state != "delivered":
                    await anyio.sleep(0.05)
        lines = [json.loads(x) for x in outbox.read_text().splitlines() if x.strip()]
        assert [line["deliveryKey"].split(":")[0] for line in lines] == [cid]
        assert "first answer" in json.dumps(lines[0]) and "second answer" not in json.dumps(lines[0])
    finally:
        if server.proc is not None:
            server.stop()

"""The service's follower against a FastMCP 4 Tasks server (``fastmcp-tasks``, in-memory
backend) on loopback HTTP: the server most Tasks users will run. FastMCP's own client starts
the tasks; afterword follows them (its requests must pass FastMCP's capability and ``Mcp-Name``
checks) until the answer is delivered, and its ``tasks/cancel`` reaches FastMCP's engine."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from _taskfollow import require_sdk2

require_sdk2()

import anyio  # noqa: E402
import pytest  # noqa: E402

fastmcp_tasks = pytest.importorskip(
    "fastmcp_tasks", reason="the FastMCP Tasks server needs fastmcp-tasks (the [test] extra pins it)"
)

import uvicorn  # noqa: E402
from _service import outbox_lines  # noqa: E402
from fastmcp import Client, FastMCP  # noqa: E402
from fastmcp.utilities.tasks import TaskConfig  # noqa: E402
from fastmcp_tasks.client import call_tool_task  # noqa: E402
from test_task_follow import REPLY, adopt, record, service_for, until  # noqa: E402

from afterword.protocol.taskanswers import Polled, Unknown  # noqa: E402
from afterword.worker.taskfollow import load_wire  # noqa: E402

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def fastmcp_serving(gate: anyio.Event) -> AsyncIterator[str]:
    mcp = FastMCP("fastmcp-tasks")
    mcp.add_extension(fastmcp_tasks.TasksExtension(url="memory://"))

    @mcp.tool(task=TaskConfig(mode="optional", poll_interval=timedelta(milliseconds=0)))
    async def reindex(key: str) -> dict[str, Any]:
        """Reindex ``key`` (waits for the test's gate)."""
        await gate.wait()
        return {"key": key, "rows": 42}

    app = mcp.http_app(stateless_http=True, json_response=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        finally:
            server.should_exit = True
    sock.close()


async def start(url: str, key: str) -> str:
    async with Client(url) as client:
        task = await call_tool_task(client, "reindex", {"key": key})
    return task.task_id


async def test_a_fastmcp_task_is_followed_to_one_delivered_answer(tmp_path: Path) -> None:
    gate = anyio.Event()
    async with fastmcp_serving(gate) as url, service_for(tmp_path, url) as service:
        task_id = await start(url, "repo")
        cid = await adopt(service, task_id, hint=0)
        gate.set()
        rec = await until(service, cid, lambda r: r.state == "delivered")
        config = service.config
    lines = [line for line in outbox_lines(config) if line["deliveryKey"].startswith(cid + ":")]
    assert len(lines) == 1 and lines[0]["conversationId"] == REPLY and "42" in lines[0]["text"]
    assert rec.task.status == "completed"


async def test_fastmcp_answers_the_follower_and_takes_its_cancel(tmp_path: Path) -> None:
    gate = anyio.Event()
    wire = load_wire()
    assert wire is not None
    async with fastmcp_serving(gate) as url, service_for(tmp_path, url) as service:
        task_id = await start(url, "logs")
        working = await wire.get(url, {}, task_id, 10)
        unknown = await wire.get(url, {}, "task-nobody-made", 10)
        cid = await adopt(service, task_id, hint=60_000)
        await service.cancel_continuation(cid)
        rec = await until(service, cid, lambda r: r.task.cancel_sent_at_ms is not None)
        after = await wire.get(url, {}, task_id, 10)
        gate.set()
    assert isinstance(working, Polled) and working.outcome.status == "working"
    assert isinstance(unknown, Unknown)
    assert rec.state == "cancelled" and rec.task.cancel_ok is True
    assert isinstance(after, Polled) and after.outcome.status == "cancelled"
    assert record(service, cid).state == "cancelled"

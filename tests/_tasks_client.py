"""A plain MCP SDK 2.x client for the Tasks test servers (tests/tasks_servers/), and their launchers.

No afterword code: the servers' behaviour is checked with the SDK alone before the bridge is
tested against them. The client declares the tasks extension with a ``ResultClaim`` on
``resultType: "task"`` and takes the handle raw (``allow_claimed=True``); the wire models are
deliberately loose so a hostile server's malformed answers reach the test as they were sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp import StdioServerParameters
from mcp.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"
SERVERS = Path(__file__).resolve().parent / "tasks_servers"


class TaskHandle(Result):
    """A ``tools/call`` answered with a task (loose: every field as the server sent it)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: Any = Field(default=None, alias="taskId")
    status: Any = None
    poll_interval_ms: Any = Field(default=None, alias="pollIntervalMs")
    ttl_ms: Any = Field(default=None, alias="ttlMs")


class TaskDetail(Result):
    """A ``tasks/get`` answer, kept whole in ``raw`` (``model_extra`` plus the known fields)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: Any = Field(default=None, alias="taskId")
    status: Any = None
    poll_interval_ms: Any = Field(default=None, alias="pollIntervalMs")
    result: Any = None
    error: Any = None
    input_requests: Any = Field(default=None, alias="inputRequests")


class TaskIdParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(serialization_alias="taskId")


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(serialization_alias="inputResponses")


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTask(Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


async def _never_resolve(handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
    raise AssertionError("the tests take task handles raw (allow_claimed=True)")


class TasksClient(ClientExtension):
    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=TaskHandle, resolve=_never_resolve),)


class Tasks:
    """One connected client: call a tool for a handle, then get / cancel / update."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, tool: str, arguments: dict[str, Any]) -> TaskHandle | CallToolResult:
        await self.client.list_tools()  # 2026-07-28: the tool's listing backs its call headers
        result = await self.client.session.call_tool(tool, arguments, allow_claimed=True)
        assert isinstance(result, TaskHandle | CallToolResult), type(result)
        return result

    async def start(self, tool: str, arguments: dict[str, Any]) -> TaskHandle:
        result = await self.call(tool, arguments)
        assert isinstance(result, TaskHandle), result
        return result

    async def get(self, task_id: str) -> TaskDetail:
        return await self.client.session.send_request(
            GetTask(params=TaskIdParams(task_id=task_id)), TaskDetail
        )

    async def cancel(self, task_id: str) -> None:
        await self.client.session.send_request(CancelTask(params=TaskIdParams(task_id=task_id)), Result)

    async def update(self, task_id: str, responses: dict[str, Any]) -> None:
        params = UpdateParams(task_id=task_id, input_responses=responses)
        await self.client.session.send_request(UpdateTask(params=params), Result)

    async def until(self, task_id: str, statuses: set[str], limit_s: float = 20.0) -> TaskDetail:
        """Poll until the task's status is one of ``statuses`` (bounded; a gate moves it)."""
        with anyio.fail_after(limit_s):
            while True:
                detail = await self.get(task_id)
                if detail.status in statuses:
                    return detail
                await anyio.sleep(0.02)


@asynccontextmanager
async def connect(target: str | StdioServerParameters, *, declare: bool = True) -> AsyncIterator[Tasks]:
    """A client on a URL or a stdio server; ``declare=False`` leaves the extension undeclared."""
    extensions = [TasksClient()] if declare else []
    async with Client(target, mode="2026-07-28", extensions=extensions, cache=None) as client:
        yield Tasks(client)


def script(name: str) -> str:
    return str(SERVERS / f"{name}.py")


def stdio(name: str, gates: Path, *extra: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "HOME", "LANG")}
    return StdioServerParameters(
        command=sys.executable, args=[script(name), "--gates", str(gates), *extra], env=env
    )


@contextmanager
def http_server(name: str, gates: Path, port: int, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run a test server on loopback HTTP; stops it (terminate, then kill) on exit."""
    from test_mcp_e2e import wait_port

    log = (gates / f"{name}-{port}.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, script(name), "--http", "--port", str(port), "--gates", str(gates), *extra],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        wait_port(proc, port)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def open_gate(gates: Path, key: str, outcome: dict[str, Any] | None = None) -> None:
    """Let the task named ``key`` end, with ``outcome`` (see tests/tasks_servers/_gate.py)."""
    tmp = gates / f".{key}.tmp"
    tmp.write_text(json.dumps(outcome or {"status": "completed"}))
    tmp.rename(gates / key)

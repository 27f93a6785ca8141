"""report-tasks: an MCP server that answers long tool calls with a task handle (MCP Tasks).

Written directly on the MCP Python SDK 2.x extension API (``mcp.server.extension``), with no
afterword code in it: its ``write_report`` tool answers ``tools/call`` at once with a task
handle (``resultType: "task"``), runs the work in the background, and serves ``tasks/get``,
``tasks/cancel`` and ``tasks/update`` (the ``io.modelcontextprotocol/tasks`` extension). A host
that hands the handle to afterword gets the answer delivered into the conversation later.

    python examples/tasks_server.py                              # stdio
    python examples/tasks_server.py --http --port 8767           # loopback HTTP, endpoint /mcp

Task state lives in this process's memory: a restarted server has forgotten its tasks (a
``tasks/get`` for them answers "not found"). Needs the SDK 2.x line (``pip install
'afterword[mcp]'``); ``afterword demo --tasks`` runs it. The ``TaskBoard`` and
``TasksExtension`` below are reused by the bridge's test servers (tests/tasks_servers/).
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
from anyio.abc import TaskGroup
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolRequestParams, RequestParams
from pydantic import ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
TERMINAL = frozenset({"completed", "failed", "cancelled"})

log = logging.getLogger("report-tasks")


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Task:
    """One task's server-side state: what ``tasks/get`` reports."""

    task_id: str
    tool: str
    arguments: dict[str, Any]
    status: str = "working"
    created_at: str = field(default_factory=_now)
    updated_at: str = field(default_factory=_now)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None
    status_message: str | None = None
    changed: anyio.Event = field(default_factory=anyio.Event)
    answers: dict[str, Any] | None = None

    def move(self, status: str, **fields: Any) -> bool:
        """Change state unless the task already ended; wake whoever waits on it."""
        if self.status in TERMINAL:
            return False
        self.status = status
        for name, value in fields.items():
            setattr(self, name, value)
        self.updated_at = _now()
        self.changed.set()
        self.changed = anyio.Event()
        return True


# A task body: gets its task, runs to the end and moves it (complete/fail/ask...).
Runner = Callable[[Task, "TaskBoard"], Awaitable[None]]


class TaskBoard:
    """The tasks of this process (in memory: a restart forgets them)."""

    def __init__(self, poll_interval_ms: int | None = 100, ttl_ms: int | None = 3_600_000) -> None:
        self.tasks: dict[str, Task] = {}
        self.poll_interval_ms = poll_interval_ms
        self.ttl_ms = ttl_ms

    def create(self, tool: str, arguments: dict[str, Any]) -> Task:
        task = Task(task_id=uuid.uuid4().hex, tool=tool, arguments=arguments)
        self.tasks[task.task_id] = task
        return task

    def find(self, task_id: str) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            raise MCPError(code=INVALID_PARAMS, message=f"Task {task_id} not found")
        return task

    def cancel_requested(self, task: Task) -> None:
        """A ``tasks/cancel`` named ``task`` (before it moves). Subclasses observe it."""

    def handle(self, task: Task) -> dict[str, Any]:
        """The ``CreateTaskResult`` a ``tools/call`` answers with."""
        return {"resultType": "task", **self._fields(task)}

    def detail(self, task: Task) -> dict[str, Any]:
        """The ``tasks/get`` answer: the task's fields plus its outcome for its status."""
        body: dict[str, Any] = {"resultType": "complete", **self._fields(task)}
        if task.status == "completed" and task.result is not None:
            body["result"] = task.result
        elif task.status == "failed" and task.error is not None:
            body["error"] = task.error
        elif task.status == "input_required" and task.input_requests is not None:
            body["inputRequests"] = task.input_requests
        return body

    def _fields(self, task: Task) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "taskId": task.task_id,
            "status": task.status,
            "createdAt": task.created_at,
            "lastUpdatedAt": task.updated_at,
            "ttlMs": self.ttl_ms,
        }
        if self.poll_interval_ms is not None:
            fields["pollIntervalMs"] = self.poll_interval_ms
        if task.status_message is not None:
            fields["statusMessage"] = task.status_message
        return fields


def complete(task: Task, text: str, structured: dict[str, Any] | None = None) -> bool:
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    if structured is not None:
        result["structuredContent"] = structured
    return task.move("completed", result=result)


def fail(task: Task, message: str) -> bool:
    return task.move("failed", error={"code": -32603, "message": message}, status_message=message)


class TaskIdParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


def opted_in(meta: Mapping[str, Any] | None) -> bool:
    """Whether this request's ``_meta`` declares the tasks extension (SEP-2133 per request)."""
    caps = (meta or {}).get(CLIENT_CAPABILITIES)
    extensions = caps.get("extensions") if isinstance(caps, Mapping) else None
    return isinstance(extensions, Mapping) and isinstance(extensions.get(TASKS), Mapping)


class TasksExtension(Extension):
    """The server half of the tasks extension: task-making tool calls and ``tasks/*``."""

    identifier = TASKS

    def __init__(self, board: TaskBoard, runners: Mapping[str, Runner]) -> None:
        self.board = board
        self.runners = dict(runners)
        self._tg: TaskGroup | None = None

    def bind(self, tg: TaskGroup) -> None:
        """The task group the task bodies run in: they outlive the request that made them."""
        self._tg = tg

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding(method="tasks/get", params_type=TaskIdParams, handler=self._get),
            MethodBinding(method="tasks/cancel", params_type=TaskIdParams, handler=self._cancel),
            MethodBinding(method="tasks/update", params_type=UpdateParams, handler=self._update),
        )

    async def _get(self, ctx: Any, params: TaskIdParams) -> dict[str, Any]:
        return self.board.detail(self.board.find(params.task_id))

    async def _cancel(self, ctx: Any, params: TaskIdParams) -> dict[str, Any]:
        task = self.board.find(params.task_id)
        self.board.cancel_requested(task)
        task.move("cancelled", status_message="cancelled by the requester")
        return {"resultType": "complete"}

    async def _update(self, ctx: Any, params: UpdateParams) -> dict[str, Any]:
        task = self.board.find(params.task_id)
        if task.status != "input_required":
            raise MCPError(code=INVALID_PARAMS, message=f"Task {task.task_id} is not waiting for input")
        task.answers = params.input_responses
        task.move("working", input_requests=None)
        return {"resultType": "complete"}

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: Any, call_next: Any) -> Any:
        runner = self.runners.get(params.name)
        if runner is None or not opted_in(ctx.meta):
            return await call_next(ctx)
        assert self._tg is not None, "bind() the extension to a task group before serving"
        task = self.board.create(params.name, dict(params.arguments or {}))
        self._tg.start_soon(self._run, runner, task)
        return self.board.handle(task)

    async def _run(self, runner: Runner, task: Task) -> None:
        try:
            await runner(task, self.board)
        except Exception as exc:  # a crashing body fails its task rather than the server
            log.warning("task %s raised %s", task.task_id, type(exc).__name__)
            fail(task, f"the task raised {type(exc).__name__}")


async def serve(server: MCPServer, extension: TasksExtension, transport: str, host: str, port: int) -> None:
    """Serve stdio or loopback streamable HTTP (stateless, JSON answers) until stopped."""
    async with anyio.create_task_group() as tg:
        extension.bind(tg)
        try:
            if transport == "stdio":
                await server.run_stdio_async()
            else:
                import uvicorn

                app = server.streamable_http_app(stateless_http=True, json_response=True, host=host)
                config = uvicorn.Config(app, host=host, port=port, log_level="warning")
                await uvicorn.Server(config).serve()
        finally:
            tg.cancel_scope.cancel()


def arguments(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8767)
    return parser


# --- the example itself ---------------------------------------------------------------------


async def write_report_task(task: Task, board: TaskBoard) -> None:
    topic = str(task.arguments.get("topic", "the system"))
    seconds = float(task.arguments.get("seconds", 1.0))
    await anyio.sleep(max(0.0, min(seconds, 3600.0)))  # stands in for the real work
    summary = f"The report on {topic} is ready: 3 findings, none urgent."
    complete(task, summary, {"topic": topic, "findings": 3, "summary": summary})


def build() -> tuple[MCPServer, TasksExtension]:
    extension = TasksExtension(TaskBoard(), {"write_report": write_report_task})
    server = MCPServer("report-tasks", log_level="WARNING", extensions=[extension])

    @server.tool()
    async def write_report(topic: str, seconds: float = 1.0) -> str:
        """Write a report on a topic. Runs as a background task for a client that declares the
        tasks extension; answers inline (after the work) otherwise.

        Args:
            topic: what the report is about.
            seconds: how long the work takes (simulated).
        """
        task = Task(task_id="inline", tool="write_report", arguments={"topic": topic, "seconds": seconds})
        await write_report_task(task, extension.board)
        return str((task.result or {}).get("structuredContent", {}).get("summary", ""))

    return server, extension


def cli() -> None:
    args = arguments(__doc__.splitlines()[0] if __doc__ else None).parse_args()
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="report-tasks: %(message)s", force=True
    )
    server, extension = build()
    anyio.run(serve, server, extension, "http" if args.http else "stdio", args.host, args.port)


if __name__ == "__main__":
    cli()

"""An in-process Tasks server written directly on the MCP Python SDK 2.x server extension API.

No FastMCP: an ``mcp.server.extension.Extension`` contributes ``tasks/get`` and
``tasks/cancel`` (``MethodBinding``) and runs the ``start_job`` tool as a task
(``intercept_tool_call`` answers ``resultType: "task"``). The task table is a plain object the
test holds (:class:`TaskBook`): the test decides when a task completes, fails, asks for input,
is forgotten (the server "lost its state"), or answers like a hostile server would (another
task's id, a malformed answer, a huge result, a ``pollIntervalMs`` of 0 or 10^9, a slow answer).

:func:`serving` runs it over streamable HTTP on a loopback port inside the test's event loop.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import mcp_types
import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"
CAPS_KEY = "io.modelcontextprotocol/clientCapabilities"
Hostility = Literal["wrong_id", "malformed", "huge", "slow", "error_500", "echo"]


class TaskParams(mcp_types.RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(alias="taskId")


@dataclass
class Task:
    status: str = "working"
    result: dict[str, Any] | None = None
    message: str | None = None
    poll_interval_ms: int | None = 300


@dataclass
class TaskBook:
    """The server's task state, driven by the test."""

    tasks: dict[str, Task] = field(default_factory=dict)
    hostile: Hostility | None = None
    huge_bytes: int = 8 * 1024 * 1024
    gets: list[str] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    declared: list[bool] = field(default_factory=list)  # did each task request declare the extension
    headers: list[dict[str, str]] = field(default_factory=list)  # each task request's HTTP headers
    release_slow: anyio.Event = field(default_factory=anyio.Event)
    polled: anyio.Event = field(default_factory=anyio.Event)
    next_id: int = 0

    def new(self, **kwargs: Any) -> str:
        self.next_id += 1
        task_id = f"task-{self.next_id}"
        self.tasks[task_id] = Task(**kwargs)
        return task_id

    def complete(self, task_id: str, text: str, structured: dict[str, Any] | None = None) -> None:
        result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
        if structured is not None:
            result["structuredContent"] = structured
        self.tasks[task_id] = Task(status="completed", result=result)

    def lose_all(self) -> None:
        self.tasks.clear()

    async def polls(self, count: int) -> None:
        """Wait until ``count`` ``tasks/get`` requests have arrived in all (a gate, not a sleep)."""
        while len(self.gets) < count:
            self.polled = anyio.Event()
            await self.polled.wait()


class TasksExtension(Extension):
    identifier = TASKS

    def __init__(self, book: TaskBook) -> None:
        self.book = book

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding(method="tasks/get", params_type=TaskParams, handler=self.get),
            MethodBinding(method="tasks/cancel", params_type=TaskParams, handler=self.cancel),
        ]

    def _declared(self, params: TaskParams) -> bool:
        caps = (params.meta or {}).get(CAPS_KEY) or {}
        return TASKS in (caps.get("extensions") or {})

    def _task(self, task_id: str) -> Task:
        task = self.book.tasks.get(task_id)
        if task is None:
            raise MCPError(code=mcp_types.INVALID_PARAMS, message=f"Task {task_id} not found")
        return task

    def _wire(self, task_id: str, task: Task) -> dict[str, Any]:
        body: dict[str, Any] = {
            "resultType": "complete",
            "taskId": task_id,
            "status": task.status,
            "createdAt": "2026-01-01T00:00:00Z",
            "lastUpdatedAt": "2026-01-01T00:00:00Z",
        }
        if task.poll_interval_ms is not None:
            body["pollIntervalMs"] = task.poll_interval_ms
        if task.message is not None:
            body["statusMessage"] = task.message
        if task.status in ("completed", "failed") and task.result is not None:
            body["result"] = task.result
        if task.status == "failed" and task.message is not None:
            body["error"] = {"code": mcp_types.INTERNAL_ERROR, "message": task.message}
        return body

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        book = self.book
        book.gets.append(params.task_id)
        book.declared.append(self._declared(params))
        http = ctx.request
        book.headers.append({k.lower(): v for k, v in http.headers.items()} if http is not None else {})
        try:
            if book.hostile == "slow":
                await book.release_slow.wait()
            if book.hostile == "echo":  # repeats the credentials it was sent, in a "not found"
                seen = book.headers[-1].get("authorization", "")
                raise MCPError(
                    code=mcp_types.INVALID_PARAMS, message=f"Task {params.task_id} unknown to {seen}"
                )
            task = self._task(params.task_id)
            if book.hostile == "wrong_id":
                return self._wire("task-someone-else", task)
            if book.hostile == "malformed":
                return {"resultType": "complete", "taskId": params.task_id, "status": "finished-ish"}
            if book.hostile == "error_500":
                raise MCPError(code=mcp_types.INTERNAL_ERROR, message="backend down")
            if book.hostile == "huge":
                huge = Task(
                    status="completed", result={"content": [{"type": "text", "text": "x" * book.huge_bytes}]}
                )
                return self._wire(params.task_id, huge)
            return self._wire(params.task_id, task)
        finally:
            book.polled.set()

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        self.book.cancels.append(params.task_id)
        if self.book.hostile == "echo":
            seen = ctx.request.headers.get("authorization", "") if ctx.request is not None else ""
            raise MCPError(code=mcp_types.INTERNAL_ERROR, message=f"cannot cancel for {seen}")
        task = self._task(params.task_id)
        if task.status not in ("completed", "failed", "cancelled"):
            task.status = "cancelled"
        return self._wire(params.task_id, task)

    async def intercept_tool_call(
        self,
        params: mcp_types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name != "start_job":
            return await call_next(ctx)
        task_id = self.book.new()
        return {"resultType": "task", "taskId": task_id, "status": "working", "pollIntervalMs": 300}


def build_server(book: TaskBook) -> MCPServer:
    server = MCPServer("sdk-tasks", extensions=[TasksExtension(book)])

    @server.tool()
    def start_job(job: str) -> str:
        """Start a long job (run as a task by the extension)."""
        return f"ran {job} in the foreground"

    return server


@asynccontextmanager
async def serving(book: TaskBook, *, json_response: bool = True) -> AsyncIterator[str]:
    """Serve ``book`` over streamable HTTP on a free loopback port; yield the MCP URL.
    ``json_response=False`` answers each request as a server-sent event stream instead."""
    app = build_server(book).streamable_http_app(json_response=json_response, stateless_http=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            server.should_exit = True
    sock.close()

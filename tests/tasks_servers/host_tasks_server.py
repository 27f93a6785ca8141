"""A Tasks server written directly on the MCP Python SDK 2.x extension API, for the host-side
tests (tests/test_mcp_tasks_host*.py). Not FastMCP: this is the bare ``mcp.server.extension``
surface, so the host is tested against the protocol rather than one framework.

Every ``tools/call`` is appended to ``--record`` as a JSON line saying whether the request
declared ``io.modelcontextprotocol/tasks``, so a test can read what the server received.
When it was declared, ``job`` answers with a task handle; otherwise it runs inline. A task
completes once the file ``<--gates>/<key>`` exists (a test opens the gate; no timing), fails
when that file says ``fail``; ``job(wrong_id=true)`` answers ``tasks/get`` about another task. ``tasks/cancel`` is recorded too. ``malformed`` answers with a
broken handle of the kind asked for.

    python tests/tasks_servers/host_tasks_server.py --record R --gates DIR [--http --port P]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
from pathlib import Path
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, RequestParams
from mcp_types.jsonrpc import INVALID_PARAMS
from pydantic import ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"
CAPS_KEY = "io.modelcontextprotocol/clientCapabilities"


class TaskParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    task_id: str = Field(alias="taskId")


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    meta = ctx.meta
    raw: Any = meta.model_dump(by_alias=True) if hasattr(meta, "model_dump") else (meta or {})
    caps = raw.get(CAPS_KEY) or {}
    return TASKS in (caps.get("extensions") or {})


class HostTasks(Extension):
    identifier = TASKS

    def __init__(self, record: Path, gates: Path) -> None:
        self.record = record
        self.gates = gates
        self.tasks: dict[str, dict[str, Any]] = {}

    def log(self, entry: dict[str, Any]) -> None:
        with self.record.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding(method="tasks/get", params_type=TaskParams, handler=self.get),
            MethodBinding(method="tasks/cancel", params_type=TaskParams, handler=self.cancel),
        ]

    def _task(self, task_id: str) -> dict[str, Any]:
        task = self.tasks.get(task_id)
        if task is None:
            raise MCPError(code=INVALID_PARAMS, message=f"Task {task_id} not found")
        return task

    def _fields(self, task_id: str, status: str) -> dict[str, Any]:
        task = self.tasks[task_id]
        return {
            "taskId": task_id,
            "status": status,
            "createdAt": "2030-01-01T00:00:00Z",
            "lastUpdatedAt": "2030-01-01T00:00:00Z",
            "ttlMs": 3_600_000,
            "pollIntervalMs": task["poll"],
        }

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        task = self._task(params.task_id)
        self.log({"method": "tasks/get", "key": task["key"]})
        if task["wrong_id"]:  # a hostile or buggy server: answers about another task
            return {"resultType": "complete", **self._fields(params.task_id, "working"), "taskId": "t-other"}
        if task["cancelled"]:
            return {"resultType": "complete", **self._fields(params.task_id, "cancelled")}
        gate = self.gates / task["key"]
        if not gate.exists():
            return {"resultType": "complete", **self._fields(params.task_id, "working")}
        if gate.read_text().strip() == "fail":
            message = f"{task['key']} broke"
            if task["echo"]:  # a careless or hostile server repeats the capability it was handed
                message += " with token " + os.environ.get("MONO_AGENT_CONTINUATION_CLAIM_TOKEN", "-")
            return {
                "resultType": "complete",
                **self._fields(params.task_id, "failed"),
                "error": {"code": -32603, "message": message},
            }
        structured: dict[str, Any] = {"job": task["text"], "finished": True}
        if task["pad"]:
            structured["log"] = "." * task["pad"]
        result = {
            "content": [{"type": "text", "text": f"{task['text']} finished"}],
            "structuredContent": structured,
            "isError": False,
        }
        return {"resultType": "complete", **self._fields(params.task_id, "completed"), "result": result}

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        task = self._task(params.task_id)
        task["cancelled"] = True
        self.log({"method": "tasks/cancel", "key": task["key"]})
        return {"resultType": "complete", **self._fields(params.task_id, "cancelled")}

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: Any
    ) -> Any:
        args = params.arguments or {}
        opted_in = declared(ctx)
        self.log({"method": "tools/call", "tool": params.name, "declared": opted_in, "args": args})
        if not opted_in:
            return await call_next(ctx)
        if params.name == "malformed":
            return malformed(str(args.get("kind", "")))
        if params.name != "job":
            return await call_next(ctx)
        task_id = "t-" + secrets.token_hex(16)
        self.tasks[task_id] = {
            "key": str(args["key"]),
            "text": str(args.get("text", "")),
            "poll": int(args.get("poll_ms", 50)),
            "wrong_id": bool(args.get("wrong_id", False)),
            "pad": int(args.get("pad", 0)),
            "echo": bool(args.get("echo", False)),  # a huge result: bytes of log in structuredContent
            "cancelled": False,
        }
        return {"resultType": "task", **self._fields(task_id, "working")}


def malformed(kind: str) -> dict[str, Any]:
    base: dict[str, Any] = {"resultType": "task", "taskId": "t-ok", "status": "working"}
    if kind == "no_id":
        del base["taskId"]
    elif kind == "control":
        base["taskId"] = "t-\x07bell"
    elif kind == "status":
        base["status"] = "sleeping"
    elif kind == "long":
        base["taskId"] = "t" * 300
    elif kind == "poll":
        base["pollIntervalMs"] = "soon"
    return base


def build(record: Path, gates: Path) -> MCPServer:
    server = MCPServer("host-tasks", extensions=[HostTasks(record, gates)])

    @server.tool()
    def job(
        key: str, text: str = "", poll_ms: int = 50, wrong_id: bool = False, pad: int = 0, echo: bool = False
    ) -> str:
        """Run a job (as a task when the client declared the tasks extension)."""
        return f"{text} ran inline"

    @server.tool()
    def malformed(kind: str, key: str = "") -> str:
        """Answer with a broken task handle (only to a client that declared tasks)."""
        return "no handle: the tasks extension was not declared"

    return server


async def main(args: argparse.Namespace) -> None:
    Path(args.record + ".pid").write_text(str(os.getpid()))  # a test may kill this server
    server = build(Path(args.record), Path(args.gates))
    if args.http:
        import uvicorn

        app = server.streamable_http_app(stateless_http=True, json_response=True, host="127.0.0.1")
        config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning")
        await uvicorn.Server(config).serve()
    else:
        await server.run_stdio_async()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", required=True)
    parser.add_argument("--gates", required=True)
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    anyio.run(main, parser.parse_args())

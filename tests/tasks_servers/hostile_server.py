"""hostile-tasks: a Tasks server that misbehaves in the ways a bridge must survive.

``hostile_task(key, mode)`` makes a task; ``mode`` picks the misbehaviour:

- ``huge``: completes (when the gate ``key`` opens) with a text result of ``size`` bytes;
- ``wrong_id``: every ``tasks/get`` answers about another task id;
- ``malformed_get``: every ``tasks/get`` answers a body without a valid status;
- ``error_get``: every ``tasks/get`` answers a JSON-RPC internal error (not "not found");
- ``poll_zero`` / ``poll_huge``: advertises ``pollIntervalMs`` 0 / 10^9, then completes normally;
- ``bad_handle``: ``tools/call`` answers a malformed handle (``variant``: ``empty_id``,
  ``long_id``, ``control_id``, ``bad_status``, ``no_id``, ``number_id``); no task exists.

Built on examples/tasks_server.py.

    python tests/tasks_servers/hostile_server.py --gates DIR [--http --port N]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from _gate import examples_on_path, record, wait
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolRequestParams

examples_on_path()
from tasks_server import (  # noqa: E402
    MCPServer,
    Task,
    TaskBoard,
    TasksExtension,
    arguments,
    complete,
    serve,
)

POLL = {"poll_zero": 0, "poll_huge": 10**9}
BAD_HANDLES: dict[str, dict[str, Any]] = {
    "empty_id": {"taskId": "", "status": "working"},
    "long_id": {"taskId": "x" * 300, "status": "working"},
    "control_id": {"taskId": "abc\ndef", "status": "working"},
    "bad_status": {"taskId": "t-bad-status", "status": "finished"},
    "no_id": {"status": "working"},
    "number_id": {"taskId": 12345, "status": "working"},
}


class HostileBoard(TaskBoard):
    def _mode(self, task: Task) -> str:
        return str(task.arguments.get("mode", ""))

    def _fields(self, task: Task) -> dict[str, Any]:
        fields = super()._fields(task)
        if self._mode(task) in POLL:
            fields["pollIntervalMs"] = POLL[self._mode(task)]
        return fields

    def detail(self, task: Task) -> dict[str, Any]:
        mode = self._mode(task)
        if mode == "error_get":
            raise MCPError(code=-32603, message="internal error while reading the task")
        body = super().detail(task)
        if mode == "wrong_id":
            body["taskId"] = "not-" + task.task_id
        elif mode == "malformed_get":
            body["status"] = "exploded"
            body.pop("result", None)
        return body


class HostileExtension(TasksExtension):
    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: Any, call_next: Any) -> Any:
        args = params.arguments or {}
        if params.name == "hostile_task" and args.get("mode") == "bad_handle":
            variant = str(args.get("variant", "empty_id"))
            if variant not in BAD_HANDLES:
                raise MCPError(code=INVALID_PARAMS, message=f"unknown variant {variant!r}")
            record(self.gates, "bad_handle", key=args.get("key"), variant=variant)
            return {"resultType": "task", "pollIntervalMs": 50, **BAD_HANDLES[variant]}
        return await super().intercept_tool_call(params, ctx, call_next)

    gates: Path


def build(gates: Path) -> tuple[MCPServer, TasksExtension]:
    async def work(task: Task, board: TaskBoard) -> None:
        key = str(task.arguments["key"])
        record(gates, "created", key=key, taskId=task.task_id, mode=task.arguments.get("mode"))
        outcome = await wait(gates, key)
        if task.arguments.get("mode") == "huge":
            size = int(task.arguments.get("size", 2 * 1024 * 1024))
            complete(task, "x" * size, None)
        else:
            text = str(outcome.get("text", f"answer for {key}"))
            complete(task, text, {"key": key, "answer": text})
        record(gates, "ended", key=key, taskId=task.task_id)

    extension = HostileExtension(HostileBoard(poll_interval_ms=50), {"hostile_task": work})
    extension.gates = gates
    server = MCPServer("hostile-tasks", log_level="WARNING", extensions=[extension])

    @server.tool()
    async def hostile_task(key: str, mode: str, size: int = 0, variant: str = "") -> str:
        """Misbehaving work (see the module's docstring); a task for a client that declares tasks."""
        return f"inline {key}"

    return server, extension


def main() -> None:
    parser = arguments("hostile-tasks: a misbehaving Tasks server")
    parser.add_argument("--gates", type=Path, required=True)
    args = parser.parse_args()
    server, extension = build(args.gates)
    anyio.run(serve, server, extension, "http" if args.http else "stdio", args.host, args.port)


if __name__ == "__main__":
    main()

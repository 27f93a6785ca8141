"""sdk-tasks: a Tasks server written directly on the MCP SDK 2.x extension API.

Builds on examples/tasks_server.py (``TaskBoard``, ``TasksExtension``). Its ``sdk_work`` tool
makes a task that waits for the test's gate ``key``; the gate's JSON picks the ending:
``completed`` (``text``, ``structured``, ``isError``), ``failed`` (``message``), ``cancelled``,
``input_required`` (the task asks for a confirmation) or ``forget`` (the server drops the task,
so ``tasks/get`` answers "not found"). ``--poll-ms`` sets the advertised ``pollIntervalMs``;
``--record-polls`` writes an events line per ``tasks/get``.

    python tests/tasks_servers/sdk_server.py --gates DIR [--http --port N]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from _gate import examples_on_path, record, wait
from input_server import CONFIRM

examples_on_path()
from tasks_server import (  # noqa: E402
    MCPServer,
    Task,
    TaskBoard,
    TasksExtension,
    arguments,
    fail,
    serve,
)


async def end(task: Task, board: TaskBoard, gates: Path, outcome: dict[str, Any]) -> None:
    """Move ``task`` as the gate's ``outcome`` says (shared by the SDK-based test servers)."""
    key = str(task.arguments.get("key", ""))
    status = outcome.get("status", "completed")
    if status == "completed":
        text = str(outcome.get("text", f"answer for {key}"))
        structured = outcome.get("structured", {"key": key, "answer": text})
        result: dict[str, Any] = {
            "content": [{"type": "text", "text": text}],
            "isError": bool(outcome.get("isError")),
        }
        if structured is not None:
            result["structuredContent"] = structured
        moved = task.move("completed", result=result)
    elif status == "failed":
        moved = fail(task, str(outcome.get("message", f"{key} failed")))
    elif status == "cancelled":
        moved = task.move("cancelled", status_message="cancelled by the server")
    elif status == "input_required":
        moved = task.move("input_required", input_requests=CONFIRM, status_message="needs a confirmation")
    elif status == "forget":
        moved = board.tasks.pop(task.task_id, None) is not None
    else:
        raise ValueError(f"unknown gate outcome {status!r}")
    record(gates, "ended" if moved else "late", key=key, taskId=task.task_id, status=status)


class RecordingBoard(TaskBoard):
    """Records each tasks/cancel it receives (a test checks it was sent, and once)."""

    def __init__(self, gates: Path, poll_interval_ms: int | None, record_polls: bool = False) -> None:
        super().__init__(poll_interval_ms=poll_interval_ms)
        self.gates = gates
        self.record_polls = record_polls

    def detail(self, task: Task) -> dict[str, Any]:
        if self.record_polls:  # off by default: a long run would write a line per poll
            record(self.gates, "get", key=task.arguments.get("key"), taskId=task.task_id, status=task.status)
        return super().detail(task)

    def cancel_requested(self, task: Task) -> None:
        record(self.gates, "cancel", key=task.arguments.get("key"), taskId=task.task_id, was=task.status)


def build(gates: Path, poll_ms: int | None, record_polls: bool = False) -> tuple[MCPServer, TasksExtension]:
    board = RecordingBoard(gates, poll_ms, record_polls)

    async def work(task: Task, board: TaskBoard) -> None:
        record(gates, "created", key=task.arguments.get("key"), taskId=task.task_id)
        await end(task, board, gates, await wait(gates, str(task.arguments["key"])))

    extension = TasksExtension(board, {"sdk_work": work})
    server = MCPServer("sdk-tasks", log_level="WARNING", extensions=[extension])

    @server.tool()
    async def sdk_work(key: str) -> str:
        """Do the work named ``key`` (a task for a client that declares the tasks extension)."""
        outcome = await wait(gates, key)
        return str(outcome.get("text", f"answer for {key}"))

    return server, extension


def main() -> None:
    parser = arguments("sdk-tasks: a Tasks server on the SDK 2.x extension API")
    parser.add_argument("--gates", type=Path, required=True)
    parser.add_argument("--poll-ms", type=int, default=50)
    parser.add_argument("--record-polls", action="store_true", help="an events line per tasks/get")
    args = parser.parse_args()
    server, extension = build(args.gates, args.poll_ms, args.record_polls)
    anyio.run(serve, server, extension, "http" if args.http else "stdio", args.host, args.port)


if __name__ == "__main__":
    main()

"""input-tasks: a Tasks server whose task asks the requester for input (``input_required``).

``input_ask`` makes a task that moves to ``input_required`` at once, with one elicitation
request (``inputRequests.confirm``). A ``tasks/update`` answering it completes the task with
the answer; a ``tasks/cancel`` cancels it. Each step is recorded in ``<gates>/events.jsonl``
(the bridge must cancel such a task: nobody can answer inside a continuation). Built on
examples/tasks_server.py.

    python tests/tasks_servers/input_server.py --gates DIR [--http --port N]
"""

from __future__ import annotations

from pathlib import Path

import anyio
from _gate import examples_on_path, record

examples_on_path()
from tasks_server import MCPServer, Task, TaskBoard, TasksExtension, arguments, complete, serve  # noqa: E402

CONFIRM = {
    "confirm": {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": "Delete the old backups too?",
            "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        },
    }
}


class RecordingBoard(TaskBoard):
    def __init__(self, gates: Path, poll_interval_ms: int) -> None:
        super().__init__(poll_interval_ms=poll_interval_ms)
        self.gates = gates

    def cancel_requested(self, task: Task) -> None:
        record(self.gates, "cancel", key=task.arguments.get("key"), taskId=task.task_id, was=task.status)


def build(gates: Path, poll_ms: int) -> tuple[MCPServer, TasksExtension]:
    async def ask(task: Task, board: TaskBoard) -> None:
        key = str(task.arguments["key"])
        task.move("input_required", input_requests=CONFIRM, status_message="needs a confirmation")
        record(gates, "input_required", key=key, taskId=task.task_id)
        while task.status == "input_required":
            changed = task.changed
            await changed.wait()
        if task.status == "working":  # answered through tasks/update
            record(gates, "answered", key=key, taskId=task.task_id, answers=task.answers)
            complete(task, f"{key}: confirmed", {"key": key, "answers": task.answers})

    extension = TasksExtension(RecordingBoard(gates, poll_ms), {"input_ask": ask})
    server = MCPServer("input-tasks", log_level="WARNING", extensions=[extension])

    @server.tool()
    async def input_ask(key: str) -> str:
        """Work that needs a confirmation half-way (a task for a client that declares tasks)."""
        return f"inline {key}"

    return server, extension


def main() -> None:
    parser = arguments("input-tasks: a Tasks server that asks for input")
    parser.add_argument("--gates", type=Path, required=True)
    parser.add_argument("--poll-ms", type=int, default=50)
    args = parser.parse_args()
    server, extension = build(args.gates, args.poll_ms)
    anyio.run(serve, server, extension, "http" if args.http else "stdio", args.host, args.port)


if __name__ == "__main__":
    main()

"""lost-tasks: a Tasks server that loses its tasks.

Its task state is only in memory, so a restart forgets every task; and when the test opens a
task's gate the server drops that task at once, so a ``tasks/get`` for it answers the SDK's
"Task ... not found" error (JSON-RPC -32602) over stdio too, where the test cannot restart the
server without ending the session. Built on examples/tasks_server.py.

    python tests/tasks_servers/lost_server.py --gates DIR [--http --port N]
"""

from __future__ import annotations

from pathlib import Path

import anyio
from _gate import examples_on_path, record, wait

examples_on_path()
from tasks_server import MCPServer, Task, TaskBoard, TasksExtension, arguments, serve  # noqa: E402


def build(gates: Path, poll_ms: int) -> tuple[MCPServer, TasksExtension]:
    async def work(task: Task, board: TaskBoard) -> None:
        key = str(task.arguments["key"])
        record(gates, "created", key=key, taskId=task.task_id)
        await wait(gates, key)
        board.tasks.pop(task.task_id, None)
        record(gates, "forgotten", key=key, taskId=task.task_id)

    extension = TasksExtension(TaskBoard(poll_interval_ms=poll_ms), {"lost_work": work})
    server = MCPServer("lost-tasks", log_level="WARNING", extensions=[extension])

    @server.tool()
    async def lost_work(key: str) -> str:
        """Work that this server will forget about (a task for a client that declares tasks)."""
        return f"inline {key}"

    return server, extension


def main() -> None:
    parser = arguments("lost-tasks: a Tasks server that forgets its tasks")
    parser.add_argument("--gates", type=Path, required=True)
    parser.add_argument("--poll-ms", type=int, default=50)
    args = parser.parse_args()
    server, extension = build(args.gates, args.poll_ms)
    anyio.run(serve, server, extension, "http" if args.http else "stdio", args.host, args.port)


if __name__ == "__main__":
    main()

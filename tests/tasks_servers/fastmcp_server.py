"""fastmcp-tasks: a FastMCP 4 server whose tools run as MCP Tasks (``fastmcp-tasks``).

``@mcp.tool(task=True)`` with the ``TasksExtension`` on its in-memory backend (one process, no
Redis): a client that declares the tasks extension gets a task handle and polls
``tasks/get``. ``fastmcp_work`` waits for the test's gate ``key``; ``{"status": "completed"}``
returns ``{"key", "answer"}`` (structured content), ``{"status": "failed", "message"}`` raises a
``ToolError`` (the task fails). ``fastmcp_text`` returns plain text.

    python tests/tasks_servers/fastmcp_server.py --gates DIR [--http --port N]
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
from _gate import record, wait
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension


def build(gates: Path, poll_ms: int) -> FastMCP:
    mcp = FastMCP("fastmcp-tasks")
    mcp.add_extension(TasksExtension(url="memory://"))

    async def gated(key: str) -> dict[str, Any]:
        record(gates, "created", key=key)
        outcome = await wait(gates, key)
        record(gates, "ended", key=key, status=outcome.get("status", "completed"))
        if outcome.get("status") == "failed":
            raise ToolError(str(outcome.get("message", f"{key} failed")))
        return outcome

    # The advertised pollIntervalMs is the tool's (FastMCP's default is 5 s; tests want it short).
    @mcp.tool(task=TaskConfig(mode="optional", poll_interval=timedelta(milliseconds=poll_ms)))
    async def fastmcp_work(key: str) -> dict[str, Any]:
        """Do the work named ``key``; answers ``{"key", "answer"}``."""
        outcome = await gated(key)
        return {"key": key, "answer": str(outcome.get("text", f"answer for {key}"))}

    @mcp.tool(task=True)  # the plain form: FastMCP's defaults (5 s pollIntervalMs)
    async def fastmcp_text(key: str) -> str:
        """Do the work named ``key``; answers plain text."""
        outcome = await gated(key)
        return str(outcome.get("text", f"answer for {key}"))

    return mcp


async def main(gates: Path, poll_ms: int, http: bool, host: str, port: int) -> None:
    mcp = build(gates, poll_ms)
    if http:
        await mcp.run_http_async(
            show_banner=False, host=host, port=port, stateless_http=True, json_response=True
        )
    else:
        await mcp.run_async(transport="stdio", show_banner=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="fastmcp-tasks test server")
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8768)
    parser.add_argument("--gates", type=Path, required=True)
    parser.add_argument("--poll-ms", type=int, default=100)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    anyio.run(main, args.gates, args.poll_ms, args.http, args.host, args.port)

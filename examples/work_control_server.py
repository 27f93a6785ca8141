"""work-control: an example trusted MCP server that finishes long jobs after the call returns.

Its one tool, ``start_job``, accepts a job, claims a continuation *during* the tool call with
the capability its host bound to this run, answers "accepted" at once, finishes the job in the
background, and submits the result; afterword then writes the later answer into the
conversation that asked. The server never chooses where that answer goes: it has no argument
for a channel, a conversation or a callback URL, and the host's capability decides.

Run it over stdio (the host spawns it with the capability in its environment)::

    python examples/work_control_server.py

or as a loopback streamable-HTTP server (the capability arrives in each request's headers)::

    python examples/work_control_server.py --http --port 8765     # endpoint: /mcp

Written for the MCP Python SDK 2.x (``MCPServer``); the two marked fallbacks let the same file
run on SDK 1.x (``FastMCP``), which ``afterword demo`` relies on when 1.x is installed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid
from datetime import timedelta
from typing import Any

import anyio
from anyio.abc import TaskGroup

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # SDK 1.x fallback: the same server class under its old name
    from mcp.server.fastmcp import Context  # type: ignore[no-redef]
    from mcp.server.fastmcp import FastMCP as MCPServer  # type: ignore[assignment]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef]

from afterword.producer import (
    CapabilityClosed,
    ClaimCapability,
    ClaimHandle,
    NoCapability,
    Producer,
    ProducerError,
    task_hash,
)

log = logging.getLogger("work-control")

MAX_JOB_SECONDS = 3600.0
CLAIM_DEADLINE = timedelta(hours=2)  # the job must report within this, or the claim expires
DRAIN_SECONDS = 10.0  # how long a stopping server still lets running jobs submit their result


class Jobs:
    """The background jobs of this process. They outlive the tool call that started them."""

    def __init__(self) -> None:
        self.producer = Producer()
        self._tg: TaskGroup | None = None
        self._running = 0
        self._idle = anyio.Event()
        self._idle.set()

    def bind(self, tg: TaskGroup) -> None:
        self._tg = tg

    def start(self, handle: ClaimHandle, job_id: str, job: str, seconds: float) -> None:
        assert self._tg is not None, "the server runs jobs only inside main()"
        if self._running == 0:
            self._idle = anyio.Event()
        self._running += 1
        self._tg.start_soon(self._run, handle, job_id, job, seconds)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def _run(self, handle: ClaimHandle, job_id: str, job: str, seconds: float) -> None:
        try:
            await self._finish(handle, job_id, job, seconds)
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()

    async def _finish(self, handle: ClaimHandle, job_id: str, job: str, seconds: float) -> None:
        await anyio.sleep(seconds)  # stands in for the real work
        payload = {
            "jobId": job_id,
            "job": job,
            "summary": f"the job {job!r} finished after {seconds:g}s and all checks passed.",
        }
        try:
            status = await handle.submit_result(payload, idempotency_key=f"result-{job_id}")
        except ProducerError as exc:  # messages never contain a token
            log.error("job %s: result not accepted: %s", job_id, exc)
            return
        log.info("job %s: result accepted (%s)", job_id, status.state)


jobs = Jobs()
server = MCPServer(
    "work-control",
    instructions="Starts long-running jobs. The result is reported to the conversation later.",
    log_level="WARNING",
)


@server.tool()
async def start_job(job: str, ctx: Context, seconds: float = 1.0) -> str:
    """Start a long-running job. Returns at once; the result is reported to this conversation
    when the job finishes.

    Args:
        job: what to do, in a few words.
        seconds: how long the job takes (simulated).
    """
    if not 0 <= seconds <= MAX_JOB_SECONDS:
        # ToolError: its message reaches the model (SDK 2.x hides any other exception's text).
        raise ToolError(f"seconds must be between 0 and {MAX_JOB_SECONDS:g}")
    job_id = uuid.uuid4().hex[:12]
    capability = ClaimCapability.from_mcp_context(ctx)
    try:
        handle = await jobs.producer.claim(
            capability,
            task_key=f"job-{job_id}",
            task_hash=task_hash({"job": job, "seconds": seconds}),
            deadline=CLAIM_DEADLINE,
        )
    except NoCapability:
        raise ToolError(
            "not accepted: this server holds no continuation capability for this conversation"
        ) from None
    except CapabilityClosed:
        raise ToolError("not accepted: this run no longer accepts background work") from None
    jobs.start(handle, job_id, job, seconds)
    return (
        f"accepted: job {job_id} is running (continuation {handle.continuation_id}); "
        "the result will be posted to this conversation when it finishes."
    )


def http_app(host: str) -> Any:
    """The streamable-HTTP app, stateless: every tool call is a self-contained POST carrying
    the run's capability headers, so no server-side session has to be tied to a run."""
    if hasattr(server.settings, "stateless_http"):  # SDK 1.x fallback: options live in settings
        server.settings.host = host
        server.settings.stateless_http = True
        server.settings.json_response = True
        return server.streamable_http_app()
    return server.streamable_http_app(stateless_http=True, json_response=True, host=host)


async def main(transport: str, host: str, port: int) -> None:
    async with anyio.create_task_group() as tg:
        jobs.bind(tg)
        try:
            if transport == "stdio":
                await server.run_stdio_async()
            else:
                import uvicorn

                config = uvicorn.Config(http_app(host), host=host, port=port, log_level="warning")
                await uvicorn.Server(config).serve()
        finally:
            # The host closed our input (or we were interrupted): give running jobs a bounded
            # time to submit, then stop. An unfinished job's claim expires at its deadline.
            with anyio.move_on_after(DRAIN_SECONDS, shield=True):
                await jobs.wait_idle()
            tg.cancel_scope.cancel()
        await jobs.producer.aclose()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    # Replace the handler the SDK installed at import; keep the SDK quiet, our own lines on.
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="work-control: %(message)s", force=True
    )
    log.setLevel(logging.INFO)
    anyio.run(main, "http" if args.http else "stdio", args.host, args.port)


if __name__ == "__main__":
    cli()

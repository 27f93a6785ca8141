"""work-control on FastMCP 4: the same tool as ``work_control_server.py``, for framework users.

FastMCP 4 runs on the MCP Python SDK 2.x. The afterword part is the same as with the SDK's
own ``MCPServer``: read the capability from the tool's ``Context`` (environment over stdio,
the request's headers over loopback HTTP), claim during the call, answer at once, submit the
result when the work is done::

    python examples/fastmcp_server.py                          # stdio, spawned by the host
    python examples/fastmcp_server.py --http --port 8766       # loopback HTTP, endpoint /mcp

Needs ``pip install 'afterword[mcp]' 'fastmcp==4.1.4'``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid
from datetime import timedelta

import anyio
from anyio.abc import TaskGroup
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError

from afterword.producer import (
    CapabilityClosed,
    ClaimCapability,
    ClaimHandle,
    NoCapability,
    Producer,
    ProducerError,
    task_hash,
)

log = logging.getLogger("fastmcp-work-control")
CLAIM_DEADLINE = timedelta(hours=2)
DRAIN_SECONDS = 10.0

server = FastMCP("work-control", instructions="Starts long-running jobs; the result is reported later.")
producer = Producer()
background: list[TaskGroup] = []  # the task group of main(): jobs outlive the tool call
running: set[str] = set()  # job ids not yet reported


async def finish(handle: ClaimHandle, job_id: str, job: str, seconds: float) -> None:
    try:
        await report(handle, job_id, job, seconds)
    finally:
        running.discard(job_id)


async def report(handle: ClaimHandle, job_id: str, job: str, seconds: float) -> None:
    await anyio.sleep(seconds)  # stands in for the real work
    payload = {"jobId": job_id, "job": job, "summary": f"the job {job!r} finished after {seconds:g}s."}
    try:
        await handle.submit_result(payload, idempotency_key=f"result-{job_id}")
    except ProducerError as exc:  # messages never contain a token
        log.error("job %s: result not accepted: %s", job_id, exc)
        return
    log.info("job %s: result accepted", job_id)


@server.tool
async def start_job(job: str, ctx: Context, seconds: float = 1.0) -> str:
    """Start a long-running job; the result is reported to this conversation when it is done."""
    if not 0 <= seconds <= 3600:
        raise ToolError("seconds must be between 0 and 3600")
    job_id = uuid.uuid4().hex[:12]
    try:
        handle = await producer.claim(
            ClaimCapability.from_mcp_context(ctx),
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
    running.add(job_id)
    background[0].start_soon(finish, handle, job_id, job, seconds)
    return f"accepted: job {job_id} is running (continuation {handle.continuation_id})."


async def main(http: bool, host: str, port: int) -> None:
    async with anyio.create_task_group() as tg:
        background.append(tg)
        try:
            if http:
                # Stateless JSON: every call is one POST carrying its run's capability headers.
                await server.run_http_async(
                    show_banner=False, host=host, port=port, stateless_http=True, json_response=True
                )
            else:
                await server.run_async(transport="stdio", show_banner=False)
        finally:
            # Give running jobs a bounded time to submit; an unfinished claim expires later.
            with anyio.move_on_after(DRAIN_SECONDS, shield=True):
                while running:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    await producer.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="work-control on FastMCP 4")
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="fastmcp-work-control: %(message)s")
    log.setLevel(logging.INFO)
    anyio.run(main, args.http, args.host, args.port)

"""examples/fastmcp_server.py: a FastMCP 4 server claims through the same producer helper,
over stdio (capability in its environment) and over loopback HTTP (in each request's headers).
FastMCP validates arguments strictly, so the model's routing hints of the e2e test are left
out here (they are refused before the tool runs).

FastMCP 4 needs the MCP SDK 2.x: on the 1.x line (the second CI venv) these tests are skipped;
on 2.x a missing fastmcp fails them (it is in the ``test`` extra).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from _service import ENV, free_port, load, write_config
from test_mcp_e2e import (
    COPIED_ENV,
    COPIED_HEADERS,
    Recorder,
    check_delivery,
    one_run,
    outbox_lines,
    wait_port,
)

import afterword

pytestmark = pytest.mark.skipif(
    version("mcp").startswith("1."), reason="FastMCP 4 runs on the MCP SDK 2.x only"
)
EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "fastmcp_server.py")


@pytest.mark.anyio
async def test_fastmcp_server_over_stdio_claims_during_the_call(tmp_path: Path) -> None:
    servers = {"work-control": {"command": sys.executable, "args": [EXAMPLE], "env": dict(COPIED_ENV)}}
    config = load(write_config(tmp_path, servers=servers))
    async with afterword.open_service(config, environ=ENV) as service:
        recorder = Recorder(service)
        with (tmp_path / "server.log").open("w") as errlog:
            cid, rec = await one_run(
                service,
                config,
                recorder,
                run_id="run-1",
                reply_to="local:chat-1",
                job="reindex",
                errlog=errlog,
                routing={},
            )
        check_delivery(config, cid, rec, "local:chat-1", "reindex")
    assert {line["conversationId"] for line in outbox_lines(config)} == {"local:chat-1"}


@pytest.fixture
def fastmcp_http() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, EXAMPLE, "--http", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(proc, port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.anyio
async def test_fastmcp_server_over_loopback_http_claims_per_request(
    tmp_path: Path, fastmcp_http: str
) -> None:
    servers = {"work-control": {"url": fastmcp_http, "headers": dict(COPIED_HEADERS)}}
    config = load(write_config(tmp_path, servers=servers))
    async with afterword.open_service(config, environ=ENV) as service:
        recorder = Recorder(service)
        cid, rec = await one_run(
            service, config, recorder, run_id="run-2", reply_to="local:chat-2", job="backup", routing={}
        )
        check_delivery(config, cid, rec, "local:chat-2", "backup")

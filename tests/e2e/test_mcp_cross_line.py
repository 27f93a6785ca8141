"""A host on one MCP SDK line and its stdio server on the other, both ways.

The other line lives in another virtualenv: ``AFTERWORD_MCP_OTHER_PYTHON`` names its Python
(with afterword installed there too). ``.ci/run`` sets it twice: the 1.x venv's host with the
2.x venv's server, and the reverse. Without it these tests skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _service import ENV, load, write_config
from test_mcp_e2e import COPIED_ENV, EXAMPLE, Recorder, check_delivery, one_run

import afterword
from afterword.mcp_host import sdk_line

OTHER = os.environ.get("AFTERWORD_MCP_OTHER_PYTHON", "")
pytestmark = pytest.mark.skipif(
    not OTHER, reason="set AFTERWORD_MCP_OTHER_PYTHON to a Python on the other MCP SDK line (.ci/run does)"
)


def other_line() -> int:
    probe = "import importlib.metadata as m; print(m.version('mcp').split('.')[0])"
    return int(subprocess.run([OTHER, "-c", probe], capture_output=True, text=True, check=True).stdout)


@pytest.mark.anyio
async def test_a_host_and_a_server_on_different_sdk_lines(tmp_path: Path) -> None:
    server_line = other_line()
    assert server_line != sdk_line(), f"{OTHER} runs the same SDK line as {sys.executable}"
    servers = {"work-control": {"command": OTHER, "args": [EXAMPLE], "env": dict(COPIED_ENV)}}
    config = load(write_config(tmp_path, servers=servers))
    async with afterword.open_service(config, environ=ENV) as service:
        recorder = Recorder(service)
        with (tmp_path / "server.log").open("w") as errlog:
            cid, rec = await one_run(
                service,
                config,
                recorder,
                run_id="run-cross",
                reply_to="local:cross",
                job="reindex",
                errlog=errlog,
                server_line=server_line,
            )
        check_delivery(config, cid, rec, "local:cross", "reindex")

"""A type-checking host may hand the MCP helpers either kind of run: the in-process
``RunBinding`` or the host API's ``RemoteRun``. Checked by mypy (strict), as a host would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[2]

HOST = """
from afterword.app.binding import RunBinding
from afterword.clients.hostapi_client import RemoteRun
from afterword.config import Config
from afterword.mcp_host import HostRunBinding, connect_servers, open_session, settle_run


async def turn(run: RunBinding | RemoteRun, config: Config) -> None:
    either: HostRunBinding = run
    async with connect_servers(run, config) as sessions:
        assert sessions is not None
    async with open_session(run, config.mcp_servers["tools"]) as session:
        assert session is not None
    await settle_run(either, [])
"""


def test_both_kinds_of_run_type_check_as_a_host_binding(tmp_path: Path) -> None:
    source = tmp_path / "host_typed.py"
    source.write_text(HOST, encoding="utf-8")
    out, err, status = mypy_api.run(
        [
            "--strict",
            "--no-error-summary",
            "--follow-imports=silent",
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--config-file",
            os.devnull,
            str(source),
        ]
    )
    assert status == 0, out + err

"""``afterword demo`` as a user runs it: a subprocess, from an unrelated directory."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from rich.console import Console

from afterword.cli import demo


@pytest.mark.slow
def test_demo_runs_the_whole_flow(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    for name in list(env):
        if name.startswith("MONO_AGENT_") or name.startswith("AFTERWORD_"):
            del env[name]
    proc = subprocess.run(
        [sys.executable, "-m", "afterword.cli", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr

    # The lifecycle, in order, for the interactive continuation.
    cid = re.search(r"(c_[a-z0-9]+): claimed \(origin pending, mode reply\)", out)
    assert cid, out
    steps = [
        "begin_run run-",
        # The line the demo ran on is the one installed (2.x or 1.x: the demo runs on both).
        f"work-control started via the MCP SDK {version('mcp').split('.')[0]}.x (stdio subprocess) "
        "with the bound capability",
        f"{cid[1]}: claimed (origin pending, mode reply)",
        "start_job returned: accepted",
        f"capability closed, active claims: {cid[1]}",
        "origin snapshot bound",
        "host committed its turn",
        f"{cid[1]}: claimed (origin pinned, mode reply)",
        "origin activated",
        f"{cid[1]}: result_received",
        f"{cid[1]}: ready_to_deliver",  # the template synthesizer commits its answer in one step
        f"{cid[1]}: delivered (origin pinned, mode reply)",
        "Delivered to demo:chat-42:",
        "the job 'rebuild the search index' finished",
        '"historyRecorded": true',
        "nightly-audit claims on named route daily-attention",
        "claimed (origin detached_latest, mode notify_if_actionable)",
        "delivered (origin detached_latest, mode notify_if_actionable)",
        "Delivered to demo:ops-digest:",
        "2 TLS certificates expire",
        "Health: healthy (delivered 2; active 0)",
    ]
    position = 0
    for step in steps:
        found = out.find(step, position)
        assert found >= 0, f"missing or out of order: {step!r}\n{out}"
        position = found + len(step)

    # No credential reaches the output; the temporary directory is gone afterwards.
    assert "Bearer" not in out and "token" not in out.lower()
    root = re.search(r"(\S*afterword-demo-[^/\s]+)/afterword\.json", out)
    assert root, out
    assert not Path(root[1]).exists()


@pytest.mark.anyio
async def test_demo_moves_to_another_port_when_its_port_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The port is checked free before use, but another process may take it first."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        real_port = demo._port
        monkeypatch.setattr(
            demo, "_port", lambda prefer_default: taken if prefer_default else real_port(False)
        )
        out = io.StringIO()
        code = await demo.run_demo(False, console=Console(file=out, width=200, highlight=False))
    text = out.getvalue()
    assert code == 0, text
    assert f":{taken}" not in text
    assert "Health: healthy (delivered 2; active 0)" in text


@pytest.mark.anyio
async def test_demo_tasks_needs_the_sdk_2x_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """On the 1.x line (CI's second venv) the real command says so; on 2.x the check is forced."""
    if version("mcp").startswith("1."):
        proc = subprocess.run(
            [sys.executable, "-m", "afterword.cli", "demo", "--tasks"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        code, text = proc.returncode, proc.stdout + proc.stderr
    else:
        from afterword.cli import demo_tasks

        monkeypatch.setattr(demo_tasks, "_sdk_major", lambda: 1)
        out = io.StringIO()
        code = await demo_tasks.run_tasks_demo(False, console=Console(file=out, width=200))
        text = out.getvalue()
    assert code == 2
    assert "MCP Tasks need the MCP Python SDK 2.x" in text and "mcp>=2.3,<3" in text

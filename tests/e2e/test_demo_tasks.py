"""``afterword demo --tasks`` as a user runs it: a subprocess, from an unrelated directory. The
task's answer is delivered exactly once into the demo's conversation (SDK 2.x); on the 1.x line
the demo says it needs 2.x and exits 2 (tests/e2e/test_demo.py, which CI also runs on 1.x)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from afterword.clients.mcp_sdk import installed_line

pytestmark = pytest.mark.skipif(installed_line() != 2, reason="MCP Tasks need the SDK 2.x")


def test_demo_tasks_delivers_the_tasks_answer_exactly_once(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MONO_AGENT_", "AFTERWORD_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "afterword.cli", "demo", "--tasks"],
        cwd=tmp_path,
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    cid = re.search(r"write_report returned: Accepted: .*\(continuation (c_[a-z0-9]+)\)", out)
    assert cid, out
    steps = [
        "report-tasks (examples/tasks_server.py) serves MCP Tasks at http://127.0.0.1:",
        "report-tasks started via the MCP SDK 2.x (streamable HTTP",
        "model calls write_report(",
        f"{cid[1]}: claimed (origin pending, mode reply)",
        "origin activated",
        f"{cid[1]}: task-backed continuation, followed by the service (afterword polls tasks/get itself)",
        f"{cid[1]}: result_received",
        f"{cid[1]}: delivered (origin pinned, mode reply)",
        "Delivered to demo:chat-7:",
        "The report on last night's backups is ready: 3 findings, none urgent.",
        f"{cid[1]}: the task's answer was delivered exactly once",
        "Health: healthy (delivered 1; active 0)",
    ]
    position = 0
    for step in steps:
        found = out.find(step, position)
        assert found >= 0, f"missing or out of order: {step!r}\n{out}"
        position = found + len(step)
    assert out.count("Delivered to ") == 1 and out.count("3 findings, none urgent") == 1
    assert "Bearer" not in out and "token" not in out.lower()

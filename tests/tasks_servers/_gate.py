"""Test-controlled gates for the Tasks test servers: a task ends only when the test says so.

A task started with ``key`` waits until the file ``<gates>/<key>`` exists (the test writes it
atomically: tests/_tasks_client.py ``open_gate``); the file's JSON says how it ends, e.g.
``{"status": "completed"}``, ``{"status": "failed", "message": ...}``. The servers append what
they saw (task made, tasks/cancel received, input answered, task ended) to
``<gates>/events.jsonl`` so a test can check the server's side without timing. Waiting on a
file works the same over stdio and HTTP and survives the test's own process restarts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def examples_on_path() -> None:
    """The SDK servers build on the example Tasks server (examples/tasks_server.py)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))


async def wait(gates: Path, key: str) -> dict[str, Any]:
    """Wait for the test to open the gate named ``key``; its outcome."""
    path = gates / key
    while not path.exists():
        await anyio.sleep(0.01)
    outcome = json.loads(path.read_text())
    assert isinstance(outcome, dict)
    return outcome


def record(gates: Path, event: str, **fields: Any) -> None:
    """Append one event line (O_APPEND: whole lines even with several writers)."""
    # ``at`` (wall clock, seconds) lets a test check a lower bound between two events.
    line = json.dumps({"event": event, "pid": os.getpid(), "at": time.time(), **fields}) + "\n"
    fd = os.open(gates / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def events(gates: Path) -> list[dict[str, Any]]:
    path = gates / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]

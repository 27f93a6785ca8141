"""docs/producer-protocol.md runs as written: its shell blocks, in order, in one bash, from a
copy of the clone's examples (on a free port, so nothing else on 4319 is disturbed), reach a
delivered answer for both the detached and the request-bound claim."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _service import free_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "producer-protocol.md"

pytestmark = pytest.mark.timeout(300)


def _blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def test_the_recipe_covers_both_claims_with_exact_headers() -> None:
    text = "\n".join(_blocks())
    for needle in (
        "/v1/continuations/detached/claim",
        "X-Mono-Agent-Service-Name: work-control",
        'curl -sS --fail-with-body -X POST "$CLAIM_URL"',
        'curl -sS --fail-with-body -X PUT "$RESULT_URL"',
        'curl -sS --fail-with-body "$STATUS_URL"',
        "Authorization: Bearer $RESULT_TOKEN",
        "Content-Type: application/json",
        "afterword payload-hash",
    ):
        assert needle in text, needle
    prose = DOC.read_text(encoding="utf-8")
    assert "`taskHash` is a hash of the **immutable description of the task**" in prose


@pytest.mark.slow
def test_the_recipe_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    bindir = Path(sys.executable).parent
    probe = subprocess.run(
        [str(bindir / "afterword"), "payload-hash", "-h"], capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        pytest.skip("`afterword payload-hash` (issue 28) is not in this build")
    shutil.copytree(
        ROOT / "examples",
        tmp_path / "examples",
        ignore=shutil.ignore_patterns(".mono-agent", "*.jsonl", "*.log", "node_modules", "jobqueue"),
    )
    port = free_port()
    config = tmp_path / "examples" / "afterword.json"
    doc = json.loads(config.read_text())
    doc["continuations"]["port"] = port
    config.write_text(json.dumps(doc))
    script = "set -euo pipefail\n" + "\n".join(_blocks()).replace("4319", str(port))
    script += "\nkill %1\nwait %1\n"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, (
        done.stdout[-3000:] + done.stderr[-3000:] + (tmp_path / "serve.log").read_text()[-3000:]
    )
    last: dict[str, dict[str, str]] = {}  # per continuation, the last status printed
    for line in done.stdout.splitlines():
        if line.startswith("{") and '"state"' in line:
            status = json.loads(line)
            last[status["continuationId"]] = status
    assert [s["state"] for s in last.values()] == ["delivered", "delivered"]
    assert [s["originContext"] for s in last.values()] == ["detached_latest", "pinned"]
    lines = [json.loads(x) for x in (tmp_path / "examples" / "outbox.jsonl").read_text().splitlines()]
    assert [line["conversationId"] for line in lines] == ["slack:C_EXAMPLE:T_EXAMPLE", "local:chat-1"]
    assert lines[1]["text"].endswith("the search index was rebuilt")

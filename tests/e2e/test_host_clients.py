"""The host API from other languages, end to end against a real ``afterword serve`` on a free
loopback port: the TypeScript client's own ``node --test`` suite, and the Node host
(examples/node-host) running one turn with the official MCP TypeScript SDK and printing the
answer that arrives in the outbox.

Needs node >= 20 and npm. Without them these tests skip, except under ``CI=true`` (set by
``.ci/run``), where a missing toolchain is a failure. ``node_modules`` is installed by
``npm ci`` in CI; locally it is installed here when missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
from _cli import Server
from _node import NODE_HOST, TS, npm_ci, tool
from _service import write_config

from afterword.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
LEASE_MS = 1500  # short, so the TypeScript lease test waits little; heartbeats run every 500 ms


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("sidecar")
    config = write_config(root, continuations={"limits": {"runLeaseMs": LEASE_MS}})
    token = root / "host.token"
    server = Server(config)
    server.start()
    try:
        assert cli_main(["continuations", "host-token", "--config", str(config), "--file", str(token)]) == 0
        yield server, token
    finally:
        server.stop()


def test_typescript_client_suite_against_a_real_service(node: str, sidecar: tuple[Server, Path]) -> None:
    server, token = sidecar
    env = {**os.environ, "AFTERWORD_BASE_URL": server.base, "AFTERWORD_HOST_TOKEN_FILE": str(token)}
    done = subprocess.run(
        [node, "--test", "dist/test/"], cwd=TS, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # Every test ran: the live ones did not skip for want of a service.
    assert "# fail 0" in done.stdout and "# skipped 0" in done.stdout, done.stdout[-2000:]
    assert "# pass 16" in done.stdout, done.stdout[-2000:]  # 12 client tests, 4 of the payload hash


def test_node_host_runs_one_turn_end_to_end(node: str, sidecar: tuple[Server, Path]) -> None:
    server, token = sidecar
    npm_ci(NODE_HOST)
    outbox = server.config.parent / "outbox.jsonl"
    reply_to = "local:node-e2e"
    done = subprocess.run(
        [
            node,
            "host.mjs",
            "--base-url",
            server.base,
            "--token-file",
            str(token),
            "--server",
            str(ROOT / "examples" / "work_control_server.py"),
            "--python",
            sys.executable,
            "--outbox",
            str(outbox),
            "--reply-to",
            reply_to,
        ],
        cwd=NODE_HOST,
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(done.stdout)  # the real output, for the record (pytest -s shows it)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert token.read_text() not in done.stdout + done.stderr  # the capability is never shown
    lines = done.stdout.splitlines()
    # The split TypeScript SDK 2.x negotiates the revision: the stateless 2026-07-28 one with a
    # Python server on SDK 2.x, the initialize handshake with one on 1.x.
    (mcp_line,) = [line for line in lines if line.startswith("[mcp] ")]
    assert "by @modelcontextprotocol/client" in mcp_line, mcp_line
    modern = not version("mcp").startswith("1.")
    assert ("(protocol 2026-07-28, modern era)" in mcp_line) == modern, mcp_line
    assert any(line.startswith("[tool] start_job returned: accepted: job ") for line in lines), done.stdout
    assert any("active claims: c_" in line for line in lines), done.stdout
    (answer,) = [line for line in lines if line.startswith(f"[later answer -> {reply_to}] ")]
    assert "rebuild the search index" in answer
    delivered = [json.loads(x) for x in outbox.read_text().splitlines() if x.strip()]
    assert [d["conversationId"] for d in delivered] == [reply_to]
    assert answer.endswith(delivered[0]["text"])
    # The service's view: the run is activated and its one continuation delivered from the
    # pinned snapshot, not the fallback.
    run_id = next(line for line in lines if line.startswith("[run] begun ")).split()[2]
    headers = {"Authorization": f"Bearer {token.read_text()}"}
    with httpx.Client(trust_env=False, timeout=10) as client:
        run = client.get(f"{server.base}/v1/host/runs/{run_id}", headers=headers).json()
    assert run["state"] == "activated"
    (claim,) = run["claims"]
    assert (claim["state"], claim["originContext"], claim["completionKind"]) == (
        "delivered",
        "pinned",
        "synthesized",
    )


def test_typescript_client_installs_into_another_project_without_a_prebuilt_dist(
    node: str, tmp_path: Path
) -> None:
    """`npm pack` builds dist/ itself (the `prepare` script), so the tarball installs into an
    unrelated project and imports there, from a checkout that never ran `npm run build`."""
    clean = tmp_path / "host-client"
    shutil.copytree(TS, clean, ignore=shutil.ignore_patterns("dist", "*.tgz"), symlinks=True)
    packed = subprocess.run(
        [tool("npm"), "pack", "--json", "--pack-destination", str(tmp_path)],
        cwd=clean,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert packed.returncode == 0, packed.stderr[-2000:]
    [info] = json.loads(packed.stdout[packed.stdout.index("[") :])
    assert {"dist/src/index.js", "dist/src/index.d.ts", "README.md"} <= {f["path"] for f in info["files"]}
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text('{"name": "some-host", "version": "1.0.0", "type": "module"}')
    subprocess.run(
        [tool("npm"), "install", "--no-audit", "--no-fund", "--silent", str(tmp_path / info["filename"])],
        cwd=project,
        check=True,
        timeout=300,
    )
    probe = 'import { HostClient, RESERVED_ENV } from "@afterword/host-client"; console.log(typeof HostClient, RESERVED_ENV.length)'
    done = subprocess.run(
        [node, "--input-type=module", "-e", probe], cwd=project, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "function 4"

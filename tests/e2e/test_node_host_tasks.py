"""MCP Tasks from a host in another language: the Node host (examples/node-host/tasks-host.mjs,
official MCP TypeScript SDK 2.x) against a real ``afterword serve`` and real Tasks servers over
stdio (tests/tasks_servers/host_tasks_server.py, on the MCP Python SDK 2.x extension API).

The host declares ``io.modelcontextprotocol/tasks`` only to the servers the run selected,
adopts a task handle through the TypeScript client, follows the task with ``tasks/get`` while
its session lives and reports each answer; afterword delivers the answer once. A malformed
handle adopts nothing; a host cancel reaches the server as ``tasks/cancel``.

Needs node >= 20 and npm: skipped without them, a failure under ``CI=true`` (the convention of
tests/e2e/test_host_clients.py, whose toolchain fixture this reuses).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _cli import Server
from _node import NODE_HOST, npm_ci
from _service import write_config

from afterword.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
TASKS_SERVER = ROOT / "tests" / "tasks_servers" / "host_tasks_server.py"
SELECTED, OTHER = "tasks-a", "tasks-b"
# Broken handles host_tasks_server.py makes, and the field the model is told is wrong.
MALFORMED = {
    "no_id": "taskId must be a string of 1-256 characters",
    "long": "taskId must be a string of 1-256 characters",
    "control": "taskId holds a control character",
    "status": "status must be one of working, input_required, completed, failed, cancelled",
    "poll": "pollIntervalMs must be a non-negative number of milliseconds",
}


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_for(
    check: Callable[[], bool], proc: subprocess.Popen[str], what: str, timeout_s: float = 60
) -> None:
    """Wait for an observable event (a line a server recorded), failing early if the host died."""
    end = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the Node host exited before {what}:\n{out[-3000:]}\n{err[-3000:]}")
        if time.monotonic() > end:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _serve(root: Path, continuations: dict[str, Any] | None = None) -> Iterator[tuple[Server, Path, Path]]:
    """afterword serving a config whose MCP file names two Tasks servers, only ``tasks-a``
    selected in ``tools.continuationServers``."""
    gates = root / "gates"
    gates.mkdir()
    servers = {
        name: {
            "command": sys.executable,
            "args": [str(TASKS_SERVER), "--record", str(root / f"{name}.jsonl"), "--gates", str(gates)],
        }
        for name in (SELECTED, OTHER)
    }
    config = write_config(root, servers=servers, selected=[SELECTED], continuations=continuations)
    token = root / "host.token"
    server = Server(config)
    server.start()
    try:
        assert cli_main(["continuations", "host-token", "--config", str(config), "--file", str(token)]) == 0
        yield server, token, gates
    finally:
        server.stop()


@pytest.fixture()
def sidecar(tmp_path: Path) -> Iterator[tuple[Server, Path, Path]]:
    yield from _serve(tmp_path)


@pytest.fixture()
def crowded_sidecar(tmp_path: Path) -> Iterator[tuple[Server, Path, Path]]:
    """The same, admitting four unfinished continuations per run."""
    yield from _serve(tmp_path, {"limits": {"maxActivePerOrigin": 4}})


def _finish(proc: subprocess.Popen[str], timeout_s: float) -> tuple[str, str]:
    """The host's output once it exits; a host that hangs is killed and fails the test."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the Node host did not exit within {timeout_s} s:\n{out[-3000:]}\n{err[-3000:]}")


def _start_host(
    node_bin: str, server: Server, token: Path, reply_to: str, calls: list[str]
) -> subprocess.Popen[str]:
    npm_ci(NODE_HOST)
    args = [node_bin, "tasks-host.mjs", "--base-url", server.base, "--token-file", str(token)]
    args += ["--mcp-config", str(server.config.parent / "mcp.json"), "--outbox", str(_outbox(server))]
    args += ["--reply-to", reply_to, "--timeout-ms", "30000"]
    for call in calls:
        args += ["--call", call]
    return subprocess.Popen(args, cwd=NODE_HOST, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _outbox(server: Server) -> Path:
    return server.config.parent / "outbox.jsonl"


def _run(server: Server, token: Path, stdout: str) -> dict[str, Any]:
    run_id = (
        next(line for line in stdout.splitlines() if line.startswith("[run] begun ")).split()[2].rstrip(":")
    )
    headers = {"Authorization": f"Bearer {token.read_text()}"}
    with httpx.Client(trust_env=False, timeout=10) as client:
        body: dict[str, Any] = client.get(f"{server.base}/v1/host/runs/{run_id}", headers=headers).json()
    return body


def test_node_host_adopts_a_task_and_afterword_delivers_its_answer_once(
    node: str,
    sidecar: tuple[Server, Path, Path],
) -> None:
    server, token, gates = sidecar
    records = server.config.parent
    reply_to = "local:node-tasks-e2e"
    proc = _start_host(
        node,
        server,
        token,
        reply_to,
        [
            f'{OTHER}/job/{{"key": "b1", "text": "plain work"}}',
            *(f'{SELECTED}/malformed/{{"kind": "{kind}"}}' for kind in MALFORMED),
            f'{SELECTED}/job/{{"key": "a1", "text": "index rebuild"}}',
        ],
    )
    # The task is being followed (one `working` answer seen) before the work finishes.
    _wait_for(
        lambda: any(r["method"] == "tasks/get" for r in _records(records / f"{SELECTED}.jsonl")),
        proc,
        "a poll",
    )
    (gates / "a1").write_text("ok")
    out, err = _finish(proc, 90)
    print(out)
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    assert token.read_text() not in out + err

    # Only the selected server saw the extension declared; the other ran its tool inline.
    other = _records(records / f"{OTHER}.jsonl")
    assert [(r["method"], r["declared"]) for r in other] == [("tools/call", False)]
    selected_calls = [r for r in _records(records / f"{SELECTED}.jsonl") if r["method"] == "tools/call"]
    assert [(r["tool"], r["declared"]) for r in selected_calls] == [
        *[("malformed", True)] * len(MALFORMED),
        ("job", True),
    ]
    lines = out.splitlines()
    assert "[tool] job returned: plain work ran inline" in lines
    # Each malformed handle is a tool error naming the field (never its value); none is adopted.
    bad = [line for line in lines if line.startswith("[tool] malformed returned")]
    assert len(bad) == len(MALFORMED)
    for line, why in zip(bad, MALFORMED.values(), strict=True):
        prefix = "[tool] malformed returned an error: Not accepted: the tool server answered with a malformed"
        assert line.startswith(prefix) and f"(task handle: {why})" in line, line
        assert "bell" not in line and "soon" not in line and "sleeping" not in line
    # The good one: adopted, the model told it was accepted.
    (adopted,) = [line for line in lines if "answered with a task handle: adopted as " in line]
    cid = adopted.split("adopted as ")[1].split()[0]
    assert adopted.endswith("(follow: host)")
    (accepted,) = [line for line in lines if line.startswith("[tool] job returned: Accepted: ")]
    assert cid in accepted and "answer will follow in this conversation" in accepted
    assert any(line.endswith(": reported working; afterword: claimed") for line in lines), out
    assert any(f"{cid}: reported completed" in line for line in lines), out

    assert len([line for line in lines if line.startswith("[later answer -> ")]) == 1
    delivered = [json.loads(x) for x in _outbox(server).read_text().splitlines() if x.strip()]
    assert [d["conversationId"] for d in delivered] == [reply_to]  # exactly once
    assert f"[later answer -> {reply_to}] {delivered[0]['text']}" in out
    assert "index rebuild" in delivered[0]["text"]

    run = _run(server, token, out)
    assert run["state"] == "activated"
    (claim,) = run["claims"]  # the malformed handle made no continuation
    assert claim["continuationId"] == cid
    assert (claim["state"], claim["originContext"]) == ("delivered", "pinned")


def test_node_host_reports_a_failure_scrubbed_and_sends_tasks_cancel_when_told(
    node: str,
    sidecar: tuple[Server, Path, Path],
) -> None:
    """Two tasks in one turn: one fails with a message echoing the claim token the server was
    handed (the answer says it failed, the token never reaches it); the other is cancelled by
    the host, and the next report's ``cancel: true`` makes the Node host send ``tasks/cancel``."""
    server, token, gates = sidecar
    record = server.config.parent / f"{SELECTED}.jsonl"
    (gates / "broken").write_text("fail")
    reply_to = "local:node-tasks-cancel"
    calls = [f'{SELECTED}/job/{{"key": "never"}}', f'{SELECTED}/job/{{"key": "broken", "echo": true}}']
    proc = _start_host(node, server, token, reply_to, calls)
    polled = lambda key: any(r["method"] == "tasks/get" and r["key"] == key for r in _records(record))  # noqa: E731
    _wait_for(
        lambda: polled("never") and _outbox(server).exists(), proc, "a poll and the failed task's answer"
    )
    (cid,) = _continuations(server, token, lambda state: state != "delivered")
    headers = {"Authorization": f"Bearer {token.read_text()}"}
    with httpx.Client(trust_env=False, timeout=10) as client:
        cancelled = client.post(f"{server.base}/v1/host/continuations/{cid}/cancel", headers=headers, json={})
    assert cancelled.status_code == 200, cancelled.text
    out, err = _finish(proc, 90)
    print(out)
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    assert [r["key"] for r in _records(record) if r["method"] == "tasks/cancel"] == ["never"]
    assert any(
        line.endswith(f"{cid}: reported working; afterword: cancelled, cancel") for line in out.splitlines()
    )

    (delivered,) = [json.loads(x) for x in _outbox(server).read_text().splitlines() if x.strip()]
    assert delivered["conversationId"] == reply_to
    assert "failed" in delivered["text"], delivered
    run = _run(server, token, out)
    # The server put the claim token it was handed into the message; the host scrubbed it.
    assert "broken broke with token [redacted]" in delivered["text"], delivered
    assert sorted(c["state"] for c in run["claims"]) == ["cancelled", "delivered"]


def _continuations(server: Server, token: Path, where: Callable[[str], bool]) -> list[str]:
    """The ids of the service's continuations whose state passes ``where`` (the host still runs)."""
    headers = {"Authorization": f"Bearer {token.read_text()}"}
    with httpx.Client(trust_env=False, timeout=10) as client:
        page = client.get(f"{server.base}/v1/host/continuations", headers=headers)
    assert page.status_code == 200, page.text
    return [item["continuationId"] for item in page.json()["items"] if where(item["state"])]


def test_node_host_reports_lost_and_wrong_answers_and_cancels_a_task_afterword_refused(
    node: str,
    crowded_sidecar: tuple[Server, Path, Path],
) -> None:
    """A task the server forgot is reported ``lost``; one whose ``tasks/get`` names another
    task is reported ``protocol_error`` after five malformed answers in a row; one whose result
    is too big for the host API is reported ``too_large``; one asking for input is reported
    ``input_required`` and cancelled (all dead letters, with their causes). A fifth task over
    the admission limit is
    refused by afterword: the model is told no answer will follow and the server gets
    ``tasks/cancel`` for it, so nothing runs unwatched."""
    server, token, gates = crowded_sidecar
    record = server.config.parent / f"{SELECTED}.jsonl"
    (gates / "huge").write_text("ok")  # completes at once, with 5 MiB of log in its result
    calls = [
        f'{SELECTED}/job/{{"key": "gone", "forget": true}}',
        f'{SELECTED}/job/{{"key": "liar", "wrong_id": true}}',
        f'{SELECTED}/job/{{"key": "huge", "pad": {5 * 1024 * 1024}}}',
        f'{SELECTED}/job/{{"key": "asks", "ask": true}}',
        f'{SELECTED}/job/{{"key": "second"}}',
    ]
    proc = _start_host(node, server, token, "local:node-tasks-hostile", calls)
    out, err = _finish(proc, 120)
    print(out)
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    lines = out.splitlines()
    (refused,) = [line for line in lines if line.startswith("[tool] job returned an error: ")]
    assert "afterword could not take this background task (admission_limit)" in refused
    assert "no answer will follow" in refused
    # input_required: afterword dead-letters it and answers cancel; the host sends tasks/cancel.
    assert any(
        line.endswith("reported input_required; afterword: dead_lettered, cancel") for line in lines
    ), out
    assert sorted(r["key"] for r in _records(record) if r["method"] == "tasks/cancel") == ["asks", "second"]
    polls = Counter(r["key"] for r in _records(record) if r["method"] == "tasks/get")
    # Exactly five malformed answers end the liar; the others end at their first answer, which
    # a loaded machine may make the host ask for again (a poll that failed is retried).
    assert polls["liar"] == 5 and set(polls) == {"asks", "gone", "huge", "liar"}, polls
    # Over the host API's 4 MiB body: refused with 413, so the host reports too_large instead.
    assert any(line.endswith("reported too_large; afterword: dead_lettered") for line in lines), out
    assert any(line.endswith("reported lost; afterword: dead_lettered") for line in lines), out
    protocol = [line for line in lines if line.endswith("reported protocol_error; afterword: dead_lettered")]
    assert len(protocol) == 1, out
    assert not any(line.startswith("[later answer") for line in lines)
    run = _run(server, token, out)
    assert [c["state"] for c in run["claims"]] == ["dead_lettered"] * 4
    headers = {"Authorization": f"Bearer {token.read_text()}"}
    with httpx.Client(trust_env=False, timeout=10) as client:
        health = client.get(f"{server.base}/v1/host/health", headers=headers).json()
    assert "task_lost" in {cause["code"] for cause in health["causes"]}, health


@pytest.fixture()
def short_lease_sidecar(tmp_path: Path) -> Iterator[tuple[Server, Path, Path]]:
    """The same, with a host lease on host-followed tasks of one second."""
    yield from _serve(tmp_path, {"limits": {"taskHostLeaseMs": 1000}})


def test_node_host_stops_following_when_its_server_dies_and_the_host_lease_decides(
    node: str,
    short_lease_sidecar: tuple[Server, Path, Path],
) -> None:
    """The stdio server dies while its task is followed: the Node host stops (rather than
    polling a dead session forever) and exits; with nobody reporting, afterword dead-letters
    the continuation ``task_host_gone`` instead of leaving it pending."""
    server, token, _ = short_lease_sidecar
    record = server.config.parent / f"{SELECTED}.jsonl"
    proc = _start_host(node, server, token, "local:node-tasks-gone", [f'{SELECTED}/job/{{"key": "orphan"}}'])
    _wait_for(lambda: any(r["method"] == "tasks/get" for r in _records(record)), proc, "a poll")
    os.kill(int(Path(f"{record}.pid").read_text()), signal.SIGKILL)
    out, err = _finish(proc, 60)
    print(out)
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    assert any("ended; afterword's host lease decides" in line for line in out.splitlines()), out
    run_id = next(line for line in out.splitlines() if line.startswith("[run] begun ")).split()[2].rstrip(":")
    headers = {"Authorization": f"Bearer {token.read_text()}"}
    end = time.monotonic() + 30
    with httpx.Client(trust_env=False, timeout=10) as client:
        while True:
            (claim,) = client.get(f"{server.base}/v1/host/runs/{run_id}", headers=headers).json()["claims"]
            if claim["state"] != "claimed" or time.monotonic() > end:
                break
            time.sleep(0.1)
        health = client.get(f"{server.base}/v1/host/health", headers=headers).json()
    assert claim["state"] == "dead_lettered", claim
    assert claim["lastError"]["code"] == "task_host_gone", claim
    assert any(claim["continuationId"] in cause["ids"] for cause in health["causes"]), health


def test_node_host_working_reports_keep_a_long_task_alive_past_the_host_lease(
    node: str,
    short_lease_sidecar: tuple[Server, Path, Path],
) -> None:
    """A task that works for several host leases (one second each) is still delivered: every
    ``working`` report renews the lease."""
    server, token, gates = short_lease_sidecar
    record = server.config.parent / f"{SELECTED}.jsonl"
    reply_to = "local:node-tasks-long"
    proc = _start_host(
        node, server, token, reply_to, [f'{SELECTED}/job/{{"key": "long", "text": "long haul"}}']
    )
    # 16 polls at the 250 ms floor: about four leases of working reports.
    _wait_for(lambda: sum(r["method"] == "tasks/get" for r in _records(record)) >= 16, proc, "16 polls")
    (gates / "long").write_text("ok")
    out, err = _finish(proc, 60)
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    assert sum(line.endswith("reported working; afterword: claimed") for line in out.splitlines()) >= 15, out
    (delivered,) = [json.loads(x) for x in _outbox(server).read_text().splitlines() if x.strip()]
    assert delivered["conversationId"] == reply_to and "long haul" in delivered["text"]
    (claim,) = _run(server, token, out)["claims"]
    assert claim["state"] == "delivered"

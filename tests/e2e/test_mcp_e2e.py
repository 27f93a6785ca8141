"""End to end with real MCP servers: the example server over stdio (spawned by the SDK client
with the bound capability in its environment) and over loopback streamable HTTP (started
here on a free port; the capability travels in each request's headers). Each claims during a
real tool call; the later answer lands in the bound route's outbox with a receipt."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from _service import ENV, free_port, load, outbox_lines, write_config

import afterword
from afterword.app.service import ContinuationService
from afterword.config import Config
from afterword.continuations.model import Continuation
from afterword.mcp_host import connect_servers, sdk_line, settle_run, tool_outcome
from afterword.protocol.views import status_body

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "work_control_server.py")
WAIT_S = 30.0
STATELESS_REVISION = "2026-07-28"
# Values an operator (or a model, via a config it could influence) copied into the MCP config:
# the host must discard them and write the real ones last.
COPIED_ENV = {
    "MONO_AGENT_CONTINUATION_CLAIM_URL": "http://127.0.0.1:1/v1/continuations/claim",
    "MONO_AGENT_CONTINUATION_CLAIM_TOKEN": "copied-token-from-somewhere",
    "MONO_AGENT_CONTINUATION_CLAIM_MODE": "capture",
}
COPIED_HEADERS = {
    "X-Mono-Agent-Continuation-Claim-Url": "http://127.0.0.1:1/v1/continuations/claim",
    "x-mono-agent-continuation-claim-token": "copied-token-from-somewhere",
    "X-MONO-AGENT-CONTINUATION-CLAIM-MODE": "capture",
}
# Routing hints a model might put into tool arguments. They must change nothing.
MODEL_ROUTING = {
    "channel": "slack:C_ATTACKER:T_1",
    "conversationId": "slack:C_ATTACKER:T_1",
    "callbackUrl": "http://127.0.0.1:1/callback",
    "contextId": "a2a-context-7",
}


def text_of(result: Any) -> str:
    return tool_outcome(result).text


def continuation_id(text: str) -> str:
    match = re.search(r"continuation (c_[a-z0-9]+)", text)
    assert match, text
    return match.group(1)


class Recorder:
    """Keeps the latest version of each record, and whether its run's tool call was still in
    progress when the record was created."""

    def __init__(self, service: ContinuationService) -> None:
        self.latest: dict[str, Continuation] = {}
        self.created_while_call_open: dict[str, bool] = {}
        self.runs_in_call: set[str] = set()
        service.on_change.append(self.on_change)

    def on_change(self, old: Continuation | None, new: Continuation) -> None:
        if old is None:
            self.created_while_call_open[new.id] = new.claim.run_id in self.runs_in_call
        self.latest[new.id] = new

    async def delivered(self, cid: str) -> Continuation:
        with anyio.fail_after(WAIT_S):
            while (rec := self.latest.get(cid)) is None or rec.state != "delivered":
                assert rec is None or rec.state not in ("dead_lettered", "delivery_unknown"), rec.state
                await anyio.sleep(0.02)
        return rec


def history(job: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"please {job}"},
        {"role": "assistant", "content": "Started; I will report back here."},
    ]


async def one_run(
    service: ContinuationService,
    config: Config,
    recorder: Recorder,
    *,
    run_id: str,
    reply_to: str,
    job: str,
    errlog: Any = None,
    tokens: list[str] | None = None,
    routing: dict[str, str] = MODEL_ROUTING,
    server_line: int | None = None,
) -> tuple[str, Continuation]:
    """One run's turn against the "work-control" server; ``server_line`` is the server's SDK
    line when it differs from the host's (the stateless revision needs 2.x on both ends)."""
    binding = service.begin_run(run_id, f"{reply_to}#2030-01-01", reply_to)
    if tokens is not None:
        tokens.append(binding.stdio_env("work-control")["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"])
    async with connect_servers(binding, config, ["work-control"], errlog=errlog) as sessions:
        if sdk_line() == 2:
            # The stateless revision (no session, no handshake): the capability still arrives,
            # in the environment (stdio) or in this request's own headers (HTTP). A 1.x server
            # answers the 2.x client's fallback handshake instead.
            stateless = sessions["work-control"].protocol_version == STATELESS_REVISION
            assert stateless == ((server_line or 2) == 2)
        recorder.runs_in_call.add(run_id)
        result = await sessions["work-control"].call_tool(
            "start_job", {"job": job, "seconds": 0.2, **routing}
        )
        recorder.runs_in_call.discard(run_id)
        assert not tool_outcome(result).failed, text_of(result)
        assert text_of(result).startswith("accepted")
        cid = continuation_id(text_of(result))
        assert recorder.created_while_call_open[cid] is True  # claimed during the call
        assert recorder.latest[cid].origin_context == "pending"
        settlement = await settle_run(binding, history(job))
        assert settlement.active_claims == (cid,)
        rec = await recorder.delivered(cid)  # the stdio server lives until its job is done
    return cid, rec


def check_delivery(config: Config, cid: str, rec: Continuation, reply_to: str, job: str) -> None:
    lines = [line for line in outbox_lines(config) if line["deliveryKey"].startswith(cid + ":")]
    assert len(lines) == 1
    (line,) = lines
    assert line["conversationId"] == reply_to
    assert job in line["text"] and "finished" in line["text"]
    assert rec.claim.reply_to == reply_to and rec.claim.mode == "reply"
    assert rec.origin_context == "pinned"
    receipt = status_body(rec).receipt
    assert receipt is not None
    assert receipt.delivery_ids == (line["deliveryKey"],)
    assert receipt.history_recorded is True
    assert receipt.delivered_at >= line["deliveredAt"]  # the receipt follows the confirmed post


@pytest.mark.anyio
async def test_stdio_server_claims_during_a_real_tool_call(tmp_path: Path) -> None:
    servers = {"work-control": {"command": sys.executable, "args": [EXAMPLE], "env": dict(COPIED_ENV)}}
    config = load(write_config(tmp_path, servers=servers))
    log_path = tmp_path / "server.log"
    async with afterword.open_service(config, environ=ENV) as service:
        recorder = Recorder(service)
        tokens: list[str] = []
        with log_path.open("w") as errlog:
            cid, rec = await one_run(
                service,
                config,
                recorder,
                run_id="run-stdio",
                reply_to="local:chat-1",
                job="reindex",
                errlog=errlog,
                tokens=tokens,
            )
        check_delivery(config, cid, rec, "local:chat-1", "reindex")
        assert service.continuation_health().status == "healthy"
    # Every line went to the bound route: the routing hints in the tool arguments did nothing.
    assert {line["conversationId"] for line in outbox_lines(config)} == {"local:chat-1"}
    server_log = log_path.read_text()
    assert "result accepted" in server_log
    assert tokens and tokens[0] not in server_log


def wait_port(proc: subprocess.Popen[bytes], port: int) -> None:
    """Wait until an example HTTP server listens on ``port``; fail if it exits first."""
    give_up = time.monotonic() + WAIT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > give_up:
                raise RuntimeError(f"example HTTP server did not start (exit {proc.poll()})") from None
            time.sleep(0.05)


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    """The example server as a loopback streamable-HTTP server on a free port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, EXAMPLE, "--http", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_port(proc, port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.anyio
async def test_loopback_http_server_claims_per_request(tmp_path: Path, http_server: str) -> None:
    """Two runs use one long-lived HTTP server at once; each request's headers bind its claim
    to its own run, so each answer reaches its own route."""
    servers = {"work-control": {"url": http_server, "headers": dict(COPIED_HEADERS)}}
    config = load(write_config(tmp_path, servers=servers))
    async with afterword.open_service(config, environ=ENV) as service:
        recorder = Recorder(service)
        done: dict[str, tuple[str, Continuation]] = {}

        async def run(reply_to: str, job: str) -> None:
            done[reply_to] = await one_run(
                service, config, recorder, run_id=f"run-{job}", reply_to=reply_to, job=job
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "local:alpha", "backup")
            tg.start_soon(run, "local:beta", "migrate")
        for reply_to, job in (("local:alpha", "backup"), ("local:beta", "migrate")):
            cid, rec = done[reply_to]
            check_delivery(config, cid, rec, reply_to, job)
            assert rec.claim.run_id == f"run-{job}"
        assert service.continuation_health().status == "healthy"
    assert sorted(line["conversationId"] for line in outbox_lines(config)) == ["local:alpha", "local:beta"]


@pytest.mark.anyio
async def test_a_task_host_changes_nothing_for_a_claiming_server_on_either_sdk_line(tmp_path: Path) -> None:
    """With a TaskHost (MCP Tasks, docs/mcp.md) the helpers still run an ordinary claiming
    server: on 2.x the server is offered the tasks extension and ignores it, on 1.x nothing is
    declared at all; the tool call claims and the answer is delivered either way."""
    from afterword.mcp_host import TaskHost, call_tool

    servers = {"work-control": {"command": sys.executable, "args": [EXAMPLE]}}
    config = load(write_config(tmp_path, servers=servers))
    async with afterword.open_service(config, environ=ENV) as service, TaskHost(service) as tasks:
        assert tasks.declares == (sdk_line() == 2)
        recorder = Recorder(service)
        binding = service.begin_run("run-th", "local:th#2030-01-01", "local:th")
        async with connect_servers(binding, config, ["work-control"], tasks=tasks) as sessions:
            result = await call_tool(
                sessions["work-control"], "start_job", {"job": "compact", "seconds": 0.2}
            )
            assert text_of(result).startswith("accepted"), text_of(result)
            cid = continuation_id(text_of(result))
            await settle_run(binding, history("compact"))
            rec = await recorder.delivered(cid)
        check_delivery(config, cid, rec, "local:th", "compact")
        assert tasks.following == frozenset()

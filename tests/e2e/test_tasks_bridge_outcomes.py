"""The outcome table of the MCP Tasks bridge (docs/tasks-bridge.md), row by row, end to end
against real Tasks servers (tests/tasks_servers/): the real service, the host helper declaring
the extension and adopting the handle, the run settled, the task ended by the test's gate,
then what afterword did (state, cause, result, delivery, what the server received).

Stdio servers are followed by the host (the ``TaskHost`` polls while it lives); loopback HTTP
servers by the service's own follower. Every step is gated: no sleep orders anything.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from _service import ENV, free_port, load, outbox_lines, write_config

from afterword.clients.mcp_sdk import installed_line

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(installed_line() != 2, reason="MCP Tasks need the SDK 2.x"),
]

if installed_line() == 2:
    from _tasks_client import http_server, open_gate
    from tasks_servers._gate import events

    import afterword
    from afterword.continuations.model import Continuation
    from afterword.mcp_host import TaskHost, call_tool, connect_servers, settle_run, tool_outcome

SERVERS = Path(__file__).resolve().parents[1] / "tasks_servers"
CONV = "local:tasks-chat"
HISTORY = [
    {"role": "user", "content": "please do the slow thing"},
    {"role": "assistant", "content": "Started; the answer will follow here."},
]
TERMINAL = {"delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"}
WAIT_S = 45.0


@dataclass
class Bridge:
    service: Any
    config: Any
    tasks: Any
    gates: Path
    runs: int = 0

    async def turn(self, server: str, tool: str, args: dict[str, Any]) -> str:
        """One host turn whose tool call is answered with a task; the adopted continuation."""
        self.runs += 1
        binding = self.service.begin_run(f"run-{self.runs}", CONV, CONV)
        async with connect_servers(binding, self.config, [server], tasks=self.tasks) as sessions:
            outcome = tool_outcome(await call_tool(sessions[server], tool, args))
        assert not outcome.failed, outcome.text
        assert "will follow in this conversation" in outcome.text
        settlement = await settle_run(binding, HISTORY)
        (cid,) = settlement.active_claims
        return str(cid)

    def record(self, cid: str) -> Continuation:
        rec = self.service.repo.get(cid)
        assert rec is not None
        return rec

    async def ended(self, cid: str) -> Continuation:
        with anyio.fail_after(WAIT_S):
            while (rec := self.record(cid)).state not in TERMINAL:
                await anyio.sleep(0.02)
        return rec

    def delivered_lines(self, cid: str) -> list[dict[str, Any]]:
        return [line for line in outbox_lines(self.config) if line["deliveryKey"].startswith(cid + ":")]

    def server_events(self, event: str) -> list[dict[str, Any]]:
        return [e for e in events(self.gates) if e["event"] == event]


def stdio(name: str, gates: Path, *extra: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SERVERS / f"{name}.py"), "--gates", str(gates), *extra]}


@asynccontextmanager
async def bridge(
    tmp_path: Path, servers: dict[str, Any], limits: dict[str, Any] | None = None
) -> AsyncIterator[Bridge]:
    gates = tmp_path / "gates"
    gates.mkdir(exist_ok=True)
    block = {"limits": limits} if limits else None
    config = load(write_config(tmp_path, servers=servers, selected=list(servers), continuations=block))
    async with afterword.open_service(config, environ=ENV) as service, TaskHost(service) as tasks:
        yield Bridge(service, config, tasks, gates)


@pytest.fixture
def gates(tmp_path: Path) -> Path:
    path = tmp_path / "gates"
    path.mkdir()
    return path


def payload(rec: Continuation) -> Any:
    assert rec.result is not None
    return json.loads(rec.result.payload)


# -- completed ----------------------------------------------------------------------------------


async def test_completed_structured_content_is_delivered_once_fastmcp_over_stdio(
    tmp_path: Path, gates: Path
) -> None:
    async with bridge(tmp_path, {"fastmcp": stdio("fastmcp_server", gates, "--poll-ms", "20")}) as b:
        cid = await b.turn("fastmcp", "fastmcp_work", {"key": "k1"})
        assert b.record(cid).state not in TERMINAL  # held by its gate: nothing to answer yet
        open_gate(gates, "k1", {"status": "completed", "text": "42 files indexed"})
        rec = await b.ended(cid)
        assert rec.state == "delivered", rec.last_error
        assert payload(rec) == {"key": "k1", "answer": "42 files indexed"}
        assert rec.result is not None and rec.result.idempotency_key.startswith("task:")
        (line,) = b.delivered_lines(cid)
        assert line["conversationId"] == CONV


async def test_completed_text_only_is_joined_into_the_payload(tmp_path: Path, gates: Path) -> None:
    async with bridge(tmp_path, {"sdk": stdio("sdk_server", gates)}) as b:
        cid = await b.turn("sdk", "sdk_work", {"key": "t"})
        open_gate(gates, "t", {"status": "completed", "text": "plain words", "structured": None})
        rec = await b.ended(cid)
        assert rec.state == "delivered" and payload(rec) == {"text": "plain words"}
        assert len(b.delivered_lines(cid)) == 1


# -- failed -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tool", "gate"),
    [
        ("fastmcp_server", "fastmcp_work", {"status": "failed", "message": "disk full"}),  # isError
        ("sdk_server", "sdk_work", {"status": "failed", "message": "disk full"}),
        ("sdk_server", "sdk_work", {"status": "completed", "isError": True, "text": "disk full"}),
    ],
    ids=["fastmcp_tool_error", "sdk_failed", "sdk_is_error"],
)
async def test_a_failed_task_is_answered_as_failed(
    tmp_path: Path, gates: Path, name: str, tool: str, gate: dict[str, Any]
) -> None:
    async with bridge(tmp_path, {"srv": stdio(name, gates)}) as b:
        cid = await b.turn("srv", tool, {"key": "f"})
        open_gate(gates, "f", gate)
        rec = await b.ended(cid)
        assert rec.state == "delivered"
        assert payload(rec) == {"taskFailed": True, "message": "disk full"}
        assert "task_failed" in [step.error for step in rec.history]  # the cause, in the trail
        (line,) = b.delivered_lines(cid)
        assert "disk full" in line["text"] and "failed" in line["text"]  # the user is told it failed


# -- ending rows ---------------------------------------------------------------------------------


async def test_a_cancelled_task_cancels_the_continuation(tmp_path: Path, gates: Path) -> None:
    async with bridge(tmp_path, {"sdk": stdio("sdk_server", gates)}) as b:
        cid = await b.turn("sdk", "sdk_work", {"key": "c"})
        open_gate(gates, "c", {"status": "cancelled"})
        rec = await b.ended(cid)
        assert rec.state == "cancelled" and rec.result is None
        assert rec.last_error is not None and rec.last_error.code == "task_cancelled"
        assert b.delivered_lines(cid) == []


async def test_input_required_is_cancelled_at_the_server_and_dead_lettered(
    tmp_path: Path, gates: Path
) -> None:
    async with bridge(tmp_path, {"ask": stdio("input_server", gates)}) as b:
        cid = await b.turn("ask", "input_ask", {"key": "q"})
        rec = await b.ended(cid)
        assert rec.state == "dead_lettered"
        assert rec.last_error is not None and rec.last_error.code == "task_input_required"
        with anyio.fail_after(WAIT_S):  # the host sends tasks/cancel once it is told to
            while not b.server_events("cancel"):
                await anyio.sleep(0.02)
    (cancel,) = b.server_events("cancel")
    assert (cancel["key"], cancel["was"]) == ("q", "input_required")
    assert b.server_events("answered") == []


async def test_a_task_the_server_lost_is_dead_lettered_task_lost_and_shown_in_health(
    tmp_path: Path, gates: Path
) -> None:
    async with bridge(tmp_path, {"lossy": stdio("lost_server", gates)}) as b:
        cid = await b.turn("lossy", "lost_work", {"key": "gone"})
        open_gate(gates, "gone")
        rec = await b.ended(cid)
        assert rec.state == "dead_lettered"
        assert rec.last_error is not None and rec.last_error.code == "task_lost"
        health = b.service.continuation_health()
        (cause,) = [c for c in health.causes if c.code == "task_lost"]
        assert cause.ids == [cid] and health.status == "unhealthy"


async def test_a_result_over_the_limit_is_dead_lettered_too_large(tmp_path: Path, gates: Path) -> None:
    async with bridge(tmp_path, {"bad": stdio("hostile_server", gates)}) as b:
        cid = await b.turn("bad", "hostile_task", {"key": "big", "mode": "huge", "size": 400 * 1024})
        open_gate(gates, "big")
        rec = await b.ended(cid)
        assert rec.state == "dead_lettered" and rec.result is None
        assert rec.last_error is not None and rec.last_error.code == "task_result_too_large"


@pytest.mark.slow  # five bad answers with backoff between them
@pytest.mark.parametrize("mode", ["wrong_id", "malformed_get"])
async def test_answers_about_another_task_or_malformed_end_in_a_protocol_error(
    tmp_path: Path, gates: Path, mode: str
) -> None:
    async with bridge(tmp_path, {"bad": stdio("hostile_server", gates)}) as b:
        cid = await b.turn("bad", "hostile_task", {"key": mode, "mode": mode})
        rec = await b.ended(cid)
        assert rec.state == "dead_lettered"
        assert rec.last_error is not None and rec.last_error.code == "task_protocol_error"


async def test_a_host_that_exits_leaves_the_task_dead_lettered_host_gone(tmp_path: Path, gates: Path) -> None:
    servers = {"sdk": stdio("sdk_server", gates)}
    async with bridge(tmp_path, servers, {"taskHostLeaseMs": 1000}) as b:
        binding = b.service.begin_run("run-gone", CONV, CONV)
        async with TaskHost(b.service) as host:  # this host exits with the task still working
            async with connect_servers(binding, b.config, ["sdk"], tasks=host) as sessions:
                outcome = tool_outcome(await call_tool(sessions["sdk"], "sdk_work", {"key": "h"}))
            assert not outcome.failed
            (cid,) = (await settle_run(binding, HISTORY)).active_claims
        rec = await b.ended(cid)
        assert rec.state == "dead_lettered"
        assert rec.last_error is not None and rec.last_error.code == "task_host_gone"


# -- cancel and hints -------------------------------------------------------------------------


async def test_operator_cancel_sends_tasks_cancel_to_the_server(tmp_path: Path, gates: Path) -> None:
    async with bridge(tmp_path, {"sdk": stdio("sdk_server", gates)}) as b:
        cid = await b.turn("sdk", "sdk_work", {"key": "stop"})
        status = await b.service.cancel_continuation(cid)
        assert status.state == "cancelled"
        with anyio.fail_after(WAIT_S):
            while not b.server_events("cancel"):
                await anyio.sleep(0.02)
        (cancel,) = b.server_events("cancel")
        assert (cancel["key"], cancel["was"]) == ("stop", "working")
        open_gate(gates, "stop")  # the work would have finished: nothing more happens
        assert b.record(cid).state == "cancelled" and b.delivered_lines(cid) == []


async def test_a_zero_poll_interval_is_clamped_and_the_task_still_answers(
    tmp_path: Path, gates: Path
) -> None:
    async with bridge(tmp_path, {"bad": stdio("hostile_server", gates)}) as b:
        cid = await b.turn("bad", "hostile_task", {"key": "z", "mode": "poll_zero"})
        open_gate(gates, "z", {"text": "zero is fine"})
        rec = await b.ended(cid)
        assert rec.state == "delivered" and payload(rec) == {"key": "z", "answer": "zero is fine"}


# -- followed by the service (loopback HTTP servers) --------------------------------------------


@asynccontextmanager
async def served(
    tmp_path: Path, gates: Path, name: str, *extra: str, limits: dict[str, Any] | None = None
) -> AsyncIterator[tuple[Bridge, int]]:
    """A test server on loopback HTTP, selected as ``web``; the service follows its tasks."""
    port = free_port()
    with http_server(name, gates, port, *extra):
        async with bridge(tmp_path, {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}, limits) as b:
            yield b, port


async def server_saw(b: Bridge, event: str) -> list[dict[str, Any]]:
    with anyio.fail_after(WAIT_S):
        while not (seen := b.server_events(event)):
            await anyio.sleep(0.02)
    return seen


async def test_service_follows_fastmcp_over_http_to_one_delivery(tmp_path: Path, gates: Path) -> None:
    async with served(tmp_path, gates, "fastmcp_server", "--poll-ms", "20") as (b, _):
        cid = await b.turn("web", "fastmcp_work", {"key": "w"})
        rec = b.record(cid)
        assert rec.task is not None and rec.task.follow == "service"
        open_gate(gates, "w", {"status": "completed", "text": "followed by afterword"})
        rec = await b.ended(cid)
        assert rec.state == "delivered" and payload(rec) == {"key": "w", "answer": "followed by afterword"}
        assert len(b.delivered_lines(cid)) == 1
        assert b.tasks.following == frozenset()  # the host polled nothing


@pytest.mark.parametrize(
    ("gate", "state", "code"),
    [
        ({"status": "failed", "message": "disk full"}, "delivered", "task_failed"),
        ({"status": "cancelled"}, "cancelled", "task_cancelled"),
        ({"status": "forget"}, "dead_lettered", "task_lost"),
    ],
    ids=["failed", "cancelled", "lost"],
)
async def test_service_followed_endings(
    tmp_path: Path, gates: Path, gate: dict[str, Any], state: str, code: str
) -> None:
    async with served(tmp_path, gates, "sdk_server") as (b, _):
        cid = await b.turn("web", "sdk_work", {"key": "e"})
        open_gate(gates, "e", gate)
        rec = await b.ended(cid)
        assert rec.state == state
        assert code in [step.error for step in rec.history]
        lines = b.delivered_lines(cid)
        assert len(lines) == (1 if state == "delivered" else 0)
        assert all("failed: disk full" in line["text"] for line in lines)


async def test_service_followed_input_required_cancels_at_the_server(tmp_path: Path, gates: Path) -> None:
    async with served(tmp_path, gates, "input_server") as (b, _):
        cid = await b.turn("web", "input_ask", {"key": "q"})
        rec = await b.ended(cid)
        assert rec.state == "dead_lettered"
        assert rec.last_error is not None and rec.last_error.code == "task_input_required"
        (cancel,) = await server_saw(b, "cancel")
        assert (cancel["key"], cancel["was"]) == ("q", "input_required")


@pytest.mark.slow  # two server starts and two service opens
async def test_a_restarted_server_that_forgot_the_task_makes_it_task_lost(
    tmp_path: Path, gates: Path
) -> None:
    port = free_port()
    with http_server("lost_server", gates, port):
        async with bridge(tmp_path, {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}) as b:
            cid = await b.turn("web", "lost_work", {"key": "r"})
            assert b.record(cid).state == "claimed"
    with http_server("lost_server", gates, port):  # the same address, an empty memory
        async with bridge(tmp_path, {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}) as b:
            rec = await b.ended(cid)
    assert rec.state == "dead_lettered"
    assert rec.last_error is not None and rec.last_error.code == "task_lost"


@pytest.mark.parametrize(
    ("mode", "code"), [("huge", "task_result_too_large"), ("wrong_id", "task_protocol_error")]
)
async def test_service_followed_hostile_answers(tmp_path: Path, gates: Path, mode: str, code: str) -> None:
    async with served(tmp_path, gates, "hostile_server") as (b, _):
        cid = await b.turn("web", "hostile_task", {"key": mode, "mode": mode, "size": 3 * 1024 * 1024})
        open_gate(gates, mode)
        rec = await b.ended(cid)
        assert rec.state == "dead_lettered" and rec.result is None
        assert rec.last_error is not None and rec.last_error.code == code


@pytest.mark.slow  # waits out a 3 s deadline
async def test_an_unreachable_server_expires_at_the_deadline(tmp_path: Path, gates: Path) -> None:
    port = free_port()
    limits = {"taskDeadlineMs": 3000}
    with http_server("sdk_server", gates, port) as proc:
        async with bridge(tmp_path, {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}, limits) as b:
            cid = await b.turn("web", "sdk_work", {"key": "u"})
            proc.kill()  # nobody answers tasks/get any more
            proc.wait()
            rec = await b.ended(cid)
            assert rec.state == "expired" and b.delivered_lines(cid) == []


async def test_operator_cancel_of_a_service_followed_task_sends_tasks_cancel(
    tmp_path: Path, gates: Path
) -> None:
    async with served(tmp_path, gates, "sdk_server") as (b, _):
        cid = await b.turn("web", "sdk_work", {"key": "x"})
        assert (await b.service.cancel_continuation(cid)).state == "cancelled"
        (cancel,) = await server_saw(b, "cancel")
        assert (cancel["key"], cancel["was"]) == ("x", "working")
        with anyio.fail_after(WAIT_S):
            while (task := b.record(cid).task) is None or task.cancel_ok is None:
                await anyio.sleep(0.02)
        assert task.cancel_ok is True
        open_gate(gates, "x")
        assert b.record(cid).state == "cancelled" and b.delivered_lines(cid) == []


async def test_a_zero_poll_interval_is_clamped_by_the_service(tmp_path: Path, gates: Path) -> None:
    async with served(tmp_path, gates, "sdk_server", "--poll-ms", "0", "--record-polls") as (b, _):
        cid = await b.turn("web", "sdk_work", {"key": "z"})
        with anyio.fail_after(WAIT_S):
            while len(b.server_events("get")) < 4:
                await anyio.sleep(0.02)
        open_gate(gates, "z")
        assert (await b.ended(cid)).state == "delivered"
    at = [e["at"] for e in b.server_events("get")]
    gaps = [later - earlier for earlier, later in itertools.pairwise(at)]
    assert min(gaps[:3]) >= 0.2  # clamped to 250 ms, not a tight loop (a lower bound only)


@pytest.mark.slow  # two service opens
async def test_after_a_restart_the_service_polls_at_once_despite_a_huge_interval(
    tmp_path: Path, gates: Path
) -> None:
    """pollIntervalMs 10^9 is clamped to 60 s; a restarted service polls every followed task at
    once, so the task's end is seen right after the restart, not a minute later."""
    port = free_port()
    servers = {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}
    with http_server("hostile_server", gates, port):
        async with bridge(tmp_path, servers) as b:
            cid = await b.turn("web", "hostile_task", {"key": "slow", "mode": "poll_huge"})
        open_gate(gates, "slow", {"text": "seen after the restart"})
        async with bridge(tmp_path, servers) as b:
            rec = await b.ended(cid)
            assert rec.state == "delivered" and payload(rec) == {
                "key": "slow",
                "answer": "seen after the restart",
            }
            assert len(b.delivered_lines(cid)) == 1

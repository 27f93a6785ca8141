"""The Tasks test servers (tests/tasks_servers/) behave as they say, checked with the plain MCP
SDK 2.x client before the bridge is tested against them: a FastMCP 4 + fastmcp-tasks server
(stdio and loopback HTTP), servers written on the SDK 2.x extension API (plain, losing its
tasks, asking for input, hostile), and the example server examples/tasks_server.py.

Every task ends only when the test opens its gate, so each step is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(version("mcp").startswith("1."), reason="MCP Tasks need the SDK 2.x")

if not version("mcp").startswith("1."):
    from _service import free_port
    from _tasks_client import TaskHandle, connect, http_server, open_gate, stdio
    from mcp.shared.exceptions import MCPError
    from mcp.types import CallToolResult
    from tasks_servers._gate import events

NOT_FOUND = -32602
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def gates(tmp_path: Path) -> Path:
    path = tmp_path / "gates"
    path.mkdir()
    return path


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}/mcp"


@pytest.fixture
def sdk_http(gates: Path) -> Iterator[str]:
    port = free_port()
    with http_server("sdk_server", gates, port, "--record-polls"):
        yield _url(port)


# --- FastMCP 4 + fastmcp-tasks -------------------------------------------------------------


@pytest.mark.anyio
async def test_fastmcp_tasks_over_stdio_complete_fail_and_forget_unknown_ids(gates: Path) -> None:
    async with connect(stdio("fastmcp_server", gates, "--poll-ms", "40")) as tasks:
        handle = await tasks.start("fastmcp_work", {"key": "a"})
        assert handle.status == "working" and isinstance(handle.task_id, str)
        assert handle.poll_interval_ms == 40 and isinstance(handle.ttl_ms, int)
        assert (await tasks.get(handle.task_id)).status == "working"  # held by its gate
        open_gate(gates, "a", {"status": "completed", "text": "forty-two"})
        done = await tasks.until(handle.task_id, {"completed", "failed"})
        assert done.status == "completed" and done.task_id == handle.task_id
        assert done.result["structuredContent"] == {"key": "a", "answer": "forty-two"}
        assert done.result["isError"] is False

        failing = await tasks.start("fastmcp_work", {"key": "b"})
        open_gate(gates, "b", {"status": "failed", "message": "disk full"})
        failed = await tasks.until(failing.task_id, {"completed", "failed"})
        # FastMCP reports a ToolError as a completed task whose result is an error.
        assert failed.status == "completed" and failed.result["isError"] is True
        assert failed.result["content"][0]["text"] == "disk full"

        with pytest.raises(MCPError) as lost:
            await tasks.get("no-such-task")
        assert lost.value.code == NOT_FOUND
    assert [e["key"] for e in events(gates) if e["event"] == "ended"] == ["a", "b"]


@pytest.mark.anyio
async def test_fastmcp_tasks_over_loopback_http_with_the_plain_task_true_tool(gates: Path) -> None:
    port = free_port()
    with http_server("fastmcp_server", gates, port):
        async with connect(_url(port)) as tasks:
            handle = await tasks.start("fastmcp_text", {"key": "h"})
            assert handle.poll_interval_ms == 5000  # task=True: FastMCP's default advice
            task_id = handle.task_id
        open_gate(gates, "h", {"status": "completed", "text": "done over http"})
        # The protocol is stateless: another connection (another process, after a crash) polls.
        async with connect(_url(port)) as again:
            done = await again.until(task_id, {"completed"})
        assert done.result["content"][0]["text"] == "done over http"


@pytest.mark.anyio
async def test_fastmcp_answers_inline_to_a_client_that_does_not_declare_tasks(gates: Path) -> None:
    open_gate(gates, "inline", {"status": "completed", "text": "straight away"})
    async with connect(stdio("fastmcp_server", gates), declare=False) as plain:
        result = await plain.call("fastmcp_work", {"key": "inline"})
    assert isinstance(result, CallToolResult) and result.structured_content == {
        "key": "inline",
        "answer": "straight away",
    }


# --- on the SDK 2.x extension API -----------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_sdk_server_every_ending(gates: Path, transport: str, request: pytest.FixtureRequest) -> None:
    target: Any = stdio("sdk_server", gates) if transport == "stdio" else request.getfixturevalue("sdk_http")
    async with connect(target) as tasks:
        started = {
            key: await tasks.start("sdk_work", {"key": key}) for key in ("ok", "err", "bad", "stop", "ask")
        }
        assert all(h.status == "working" and h.poll_interval_ms == 50 for h in started.values())
        assert len({h.task_id for h in started.values()}) == 5
        open_gate(gates, "ok", {"status": "completed", "text": "fine"})
        open_gate(gates, "err", {"status": "completed", "isError": True, "text": "tool error"})
        open_gate(gates, "bad", {"status": "failed", "message": "it broke"})
        open_gate(gates, "stop", {"status": "cancelled"})
        open_gate(gates, "ask", {"status": "input_required"})
        ends = {"completed", "failed", "cancelled", "input_required"}
        got = {key: await tasks.until(h.task_id, ends) for key, h in started.items()}
    assert got["ok"].status == "completed" and got["ok"].result["structuredContent"] == {
        "key": "ok",
        "answer": "fine",
    }
    assert got["err"].status == "completed" and got["err"].result["isError"] is True
    assert got["bad"].status == "failed" and got["bad"].error["message"] == "it broke"
    assert got["stop"].status == "cancelled"
    assert got["ask"].status == "input_required" and "confirm" in got["ask"].input_requests


@pytest.mark.anyio
async def test_sdk_server_records_tasks_cancel_and_a_cancelled_task_stays_cancelled(
    gates: Path, sdk_http: str
) -> None:
    async with connect(sdk_http) as tasks:
        handle = await tasks.start("sdk_work", {"key": "c"})
        await tasks.cancel(handle.task_id)
        assert (await tasks.get(handle.task_id)).status == "cancelled"
        open_gate(gates, "c", {"status": "completed"})  # the work finishing later changes nothing
        late = [e for e in await _events_until(gates, "late")]
        assert late and late[0]["key"] == "c"
        assert (await tasks.get(handle.task_id)).status == "cancelled"
    cancels = [e for e in events(gates) if e["event"] == "cancel"]
    assert [(e["key"], e["was"]) for e in cancels] == [("c", "working")]
    polls = [e["status"] for e in events(gates) if e["event"] == "get"]  # --record-polls
    assert polls == ["cancelled", "cancelled"]


async def _events_until(gates: Path, event: str) -> list[dict[str, Any]]:
    import anyio

    with anyio.fail_after(10):
        while not (found := [e for e in events(gates) if e["event"] == event]):
            await anyio.sleep(0.01)
    return found


@pytest.mark.anyio
async def test_the_example_server_answers_with_a_task_that_completes(gates: Path) -> None:
    import os
    import sys

    from mcp import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=[str(EXAMPLES / "tasks_server.py")],
        env={"PATH": os.environ.get("PATH", "")},
    )
    async with connect(params) as tasks:
        handle = await tasks.start("write_report", {"topic": "backups", "seconds": 0})
        done = await tasks.until(handle.task_id, {"completed"})
    assert done.result["structuredContent"]["topic"] == "backups"
    async with connect(params, declare=False) as plain:
        inline = await plain.call("write_report", {"topic": "disks", "seconds": 0})
    assert isinstance(inline, CallToolResult) and "disks" in inline.content[0].text


# --- a server that loses its tasks ----------------------------------------------------------


@pytest.mark.anyio
async def test_lost_server_forgets_a_task_over_stdio(gates: Path) -> None:
    async with connect(stdio("lost_server", gates)) as tasks:
        handle = await tasks.start("lost_work", {"key": "gone"})
        assert (await tasks.get(handle.task_id)).status == "working"
        open_gate(gates, "gone")
        await _events_until(gates, "forgotten")
        with pytest.raises(MCPError) as lost:
            await tasks.get(handle.task_id)
    assert lost.value.code == NOT_FOUND and handle.task_id in lost.value.message


@pytest.mark.anyio
async def test_lost_server_restarted_on_the_same_port_has_forgotten_its_tasks(gates: Path) -> None:
    port = free_port()
    with http_server("lost_server", gates, port):
        async with connect(_url(port)) as tasks:
            handle = await tasks.start("lost_work", {"key": "before-restart"})
            assert (await tasks.get(handle.task_id)).status == "working"
    with http_server("lost_server", gates, port):
        async with connect(_url(port)) as tasks:
            with pytest.raises(MCPError) as lost:
                await tasks.get(handle.task_id)
    assert lost.value.code == NOT_FOUND


# --- a server that asks for input -----------------------------------------------------------


@pytest.mark.anyio
async def test_input_server_asks_then_completes_on_update_or_ends_on_cancel(gates: Path) -> None:
    async with connect(stdio("input_server", gates)) as tasks:
        answered = await tasks.start("input_ask", {"key": "yes"})
        asking = await tasks.until(answered.task_id, {"input_required"})
        request = asking.input_requests["confirm"]
        assert request["method"] == "elicitation/create"
        await tasks.update(answered.task_id, {"confirm": {"action": "accept", "content": {"ok": True}}})
        done = await tasks.until(answered.task_id, {"completed"})
        assert done.result["structuredContent"]["answers"]["confirm"]["content"] == {"ok": True}

        refused = await tasks.start("input_ask", {"key": "no"})
        await tasks.until(refused.task_id, {"input_required"})
        await tasks.cancel(refused.task_id)
        assert (await tasks.get(refused.task_id)).status == "cancelled"
    seen = [(e["event"], e.get("key")) for e in events(gates)]
    assert ("cancel", "no") in seen and ("answered", "yes") in seen and ("answered", "no") not in seen


# --- a hostile server -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_hostile_server_misbehaves_as_documented(gates: Path) -> None:
    async with connect(stdio("hostile_server", gates)) as tasks:
        huge = await tasks.start("hostile_task", {"key": "huge", "mode": "huge", "size": 3 * 1024 * 1024})
        open_gate(gates, "huge")
        big = await tasks.until(huge.task_id, {"completed"})
        assert len(big.result["content"][0]["text"]) == 3 * 1024 * 1024

        wrong = await tasks.start("hostile_task", {"key": "w", "mode": "wrong_id"})
        assert (await tasks.get(wrong.task_id)).task_id == "not-" + wrong.task_id

        broken = await tasks.start("hostile_task", {"key": "m", "mode": "malformed_get"})
        assert (await tasks.get(broken.task_id)).status == "exploded"

        failing = await tasks.start("hostile_task", {"key": "e", "mode": "error_get"})
        with pytest.raises(MCPError) as error:
            await tasks.get(failing.task_id)
        assert error.value.code == -32603

        zero = await tasks.start("hostile_task", {"key": "z", "mode": "poll_zero"})
        slow = await tasks.start("hostile_task", {"key": "s", "mode": "poll_huge"})
        assert (zero.poll_interval_ms, slow.poll_interval_ms) == (0, 10**9)
        open_gate(gates, "z")
        open_gate(gates, "s")
        assert (await tasks.until(zero.task_id, {"completed"})).poll_interval_ms == 0
        assert (await tasks.until(slow.task_id, {"completed"})).poll_interval_ms == 10**9

        bad = {}
        for variant in ("empty_id", "long_id", "control_id", "bad_status", "no_id", "number_id"):
            answer = await tasks.call(
                "hostile_task", {"key": variant, "mode": "bad_handle", "variant": variant}
            )
            assert isinstance(answer, TaskHandle)
            bad[variant] = (answer.task_id, answer.status)
    assert bad["empty_id"][0] == "" and len(bad["long_id"][0]) == 300 and "\n" in bad["control_id"][0]
    assert bad["bad_status"][1] == "finished" and bad["no_id"][0] is None and bad["number_id"][0] == 12345

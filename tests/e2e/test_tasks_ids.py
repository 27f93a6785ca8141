"""Reused ids are refused, never silently dropped (issue 30, point 7)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from test_tasks_toolloop import opened

from afterword.history import Message, MessageIdConflict, ToolCall, ToolCallIdReused, open_tool_calls
from afterword.tasks import ExecutionCoordinator, TaskNotifications, ToolResult, TurnRunner

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.anyio
async def test_a_different_body_under_a_held_message_id_is_refused(state_dir: str) -> None:
    async with opened(state_dir) as (_, history):
        await history.append("s", [Message(id="m", role="user", content="first")])
        await history.append("s", [Message(id="m", role="user", content="first")])  # a retry: no-op
        with pytest.raises(MessageIdConflict):
            await history.append("s", [Message(id="m", role="user", content="second")])
        with pytest.raises(MessageIdConflict):  # the whole batch is refused
            await history.append(
                "s", [Message(id="n", role="user", content="new"), Message(id="m", role="user", content="x")]
            )
        assert [m.content for m in await history.latest("s", 10)] == ["first"]


@pytest.mark.anyio
async def test_a_reused_tool_call_id_is_refused(state_dir: str) -> None:
    async with opened(state_dir) as (_, history):
        call = ToolCall(id="c1", name="run")
        await history.append(
            "s",
            [
                Message(id="a1", role="assistant", content="", tool_calls=(call,)),
                Message(id="r1", role="tool", content="ok", tool_call_id="c1"),
            ],
        )
        with pytest.raises(ToolCallIdReused):
            await history.append("s", [Message(id="a2", role="assistant", content="", tool_calls=(call,))])
        assert not open_tool_calls(await history.latest("s", 10))


class ReusingModel:
    """A model that opens call ``c1`` at every step (a broken provider adapter)."""

    def __init__(self) -> None:
        self.n = 0

    async def __call__(self, session_id: str, context: Sequence[Message]) -> list[Message]:
        self.n += 1
        if context[-1].role == "tool":
            return [Message(id=f"m{self.n}", role="assistant", content="done")]
        return [
            Message(id=f"m{self.n}", role="assistant", content="", tool_calls=(ToolCall(id="c1", name="t"),))
        ]


@pytest.mark.anyio
async def test_a_turn_with_a_reused_call_id_fails_instead_of_reporting_an_unwritten_result(
    state_dir: str,
) -> None:
    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        runs: list[str] = []

        async def tool(session_id: str, call: ToolCall) -> ToolResult:
            runs.append(call.id)
            return ToolResult(content=f"result {len(runs)}")

        coord = ExecutionCoordinator(
            journal, notes, TurnRunner(history, journal, notes, ReusingModel()), tools=tool
        )
        first = await coord.user_turn("s", Message(id="u1", role="user", content="go"))
        assert first.succeeded and [m.content for m in first.tool_results] == ["result 1"]
        second = await coord.user_turn("s", Message(id="u2", role="user", content="again"))
        assert not second.succeeded and second.error is not None and "ToolCallIdReused" in second.error
        assert second.tool_results == () and runs == ["c1"]  # nothing reported that was not written
        assert not open_tool_calls(await history.latest("s", 20))


def test_the_example_host_runs_twice_on_one_state_directory(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    state = str(tmp_path / "state")
    outputs = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, str(REPO / "examples" / "task_host.py"), "--state-dir", state],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout)
    second = outputs[1]
    assert "user turn done: 2 model steps, 1 tool result(s)" in second
    assert "The tests finished" in second and "consumed=True" in second
    kinds = [line.split()[0] for line in second.split("conversation:\n", 1)[1].splitlines()]
    assert kinds.count("task_notification") == 2 and kinds.count("user") == 2  # both runs are there

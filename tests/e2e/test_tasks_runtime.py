"""TaskRuntime wires everything and recovers in order; the example host runs (issue 21, item 7)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from afterword.disk import NoSyncDisk
from afterword.history import DurableHistory, Message, ToolCall, open_tool_calls
from afterword.store import RecordStore
from afterword.tasks import NOTIFICATION_KIND, TaskJournal, TaskRuntime, ToolResult, core
from tests._disk_helpers import SMALL

REPO = Path(__file__).resolve().parents[2]


def test_the_example_host_runs_the_whole_story() -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "examples" / "task_host.py")], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "tool call run_in_background" in out and "in the background" in out
    assert "user turn done: 2 model steps, 1 tool result(s)" in out
    assert "tool call read_output" in out  # the automatic turn ran its own tool call
    assert "The tests finished: 3 passed." in out
    assert "state=exited exit_code=0 committed=True delivered=True consumed=True" in out
    kinds = [line.split()[0] for line in out.split("conversation:\n", 1)[1].splitlines()]
    assert kinds == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "task_notification",
        "assistant",
        "tool",
        "assistant",
    ]


async def model(session_id: str, context: Sequence[Message]) -> list[Message]:
    return [Message(id=f"m{len(context)}", role="assistant", content="handled")]


async def no_tools(session_id: str, call: ToolCall) -> ToolResult:
    raise AssertionError("nothing should call a tool here")


@pytest.mark.anyio
async def test_open_recovers_in_order_and_the_session_moves_on(state_dir: str) -> None:
    # What a crash leaves: a tool result in the history whose task was never marked committed
    # (the command has ended meanwhile), and a later turn's tool call without a result.
    with RecordStore.open(state_dir, disk=NoSyncDisk(), options=SMALL) as store:
        journal, history = TaskJournal(store), DurableHistory(store)
        await history.append(
            "s",
            [
                Message(id="u", role="user", content="go"),
                Message(id="a1", role="assistant", content="", tool_calls=(ToolCall(id="c1", name="run"),)),
            ],
        )
        await journal.create(
            core.new_task(
                task_id="t1",
                session_id="s",
                tool_call_id="c1",
                command=["true"],
                notify="on_exit",
                cwd=None,
                output_path=journal.output_path("t1"),
                now=1.0,
            )
        )
        await journal.update(
            "t1", lambda t: core.terminate(t, core.Outcome(state="exited", exit_code=0), now=2.0)
        )
        await journal.update(
            "t1", lambda t: core.prepare_commit(t, tool_result_id="r1", reported_terminal=False)
        )
        await history.append(
            "s",
            [
                Message(id="r1", role="tool", content="started", tool_call_id="c1"),
                Message(id="a2", role="assistant", content="", tool_calls=(ToolCall(id="c2", name="slow"),)),
            ],
        )
        # The turn that opened c2 was running when the host died: its durable marker says so.
        await journal.update_control("s", lambda c: core.turn_began(c, now=4.0))
        # Another writer's conversation with a call in flight: not ours to answer.
        await history.append("other", [Message(id="q", role="assistant", content="", tool_calls=("c9",))])
    with RecordStore.open(state_dir, disk=NoSyncDisk(), options=SMALL) as store:
        async with TaskRuntime.open(store, model, make_tools=lambda rt: no_tools) as rt:
            assert rt.journal.require("t1").committed  # step 2: the result was already in the history
            with anyio.fail_after(20):
                # step 5 delivered and woke the session; wait for that turn to end
                while not rt.journal.require("t1").consumed or rt.coordinator.busy("s"):
                    await anyio.sleep(0.01)
            messages = await rt.history.latest("s", 20)
            assert open_tool_calls(await rt.history.latest("other", 20)) == {"c9"}
            assert not rt.journal.control("s").turn_open
    assert not open_tool_calls(messages)  # step 4 answered the call the crash left open
    ids = [m.id for m in messages]
    assert ids.index("tool-result:c2") < next(
        i for i, m in enumerate(messages) if m.meta.get("kind") == NOTIFICATION_KIND
    )
    assert messages[-1].content == "handled"

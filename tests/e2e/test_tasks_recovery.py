"""Recovery decides from what was written, not from what was prepared (issue 30, point 2)."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from afterword.disk import NoSyncDisk
from afterword.history import DurableHistory, Message, ToolCall, open_tool_calls
from afterword.store import RecordStore
from afterword.tasks import NOTIFICATION_KIND, TaskJournal, TaskRuntime, ToolResult, core, parse_notification
from tests._disk_helpers import SMALL


async def model(session_id: str, context: Sequence[Message]) -> list[Message]:
    return [Message(id=f"m{len(context)}", role="assistant", content="handled")]


async def no_tools(session_id: str, call: ToolCall) -> ToolResult:
    raise AssertionError("nothing should call a tool here")


@pytest.mark.anyio
async def test_a_crash_between_reported_and_the_tool_result_notifies_the_end(state_dir: str) -> None:
    # The tool waited, saw the command exit 0, and its result was going to say so: the journal
    # recorded "reported in the tool result", then the host died before the result was written.
    with RecordStore.open(state_dir, disk=NoSyncDisk(), options=SMALL) as store:
        journal, history = TaskJournal(store), DurableHistory(store)
        call = ToolCall(id="c1", name="run_and_wait")
        await history.append(
            "s",
            [
                Message(id="u", role="user", content="run it and wait"),
                Message(id="a1", role="assistant", content="", tool_calls=(call,)),
            ],
        )
        await journal.update_control("s", lambda c: core.turn_began(c, now=1.0))
        await journal.create(
            core.new_task(
                task_id="t1",
                session_id="s",
                tool_call_id="c1",
                command=["make"],
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
            "t1", lambda t: core.prepare_commit(t, tool_result_id="tool-result:c1", reported_terminal=True)
        )
    with RecordStore.open(state_dir, disk=NoSyncDisk(), options=SMALL) as store:
        async with TaskRuntime.open(store, model, make_tools=lambda rt: no_tools) as rt:
            with anyio.fail_after(20):
                while not rt.journal.require("t1").consumed or rt.coordinator.busy("s"):
                    await anyio.sleep(0.01)
            task = rt.journal.require("t1")
            messages = await rt.history.latest("s", 20)
    assert not open_tool_calls(messages)
    stand_in = next(m for m in messages if m.tool_call_id == "c1")
    assert "interrupted" in stand_in.content and "t1" in stand_in.content
    # The result that would have told the model never landed, so the model is notified instead.
    assert task.handed_off and task.terminal_reported is None and task.delivered and task.consumed
    (note,) = [m for m in messages if m.meta.get("kind") == NOTIFICATION_KIND]
    assert parse_notification(note).task.exit_code == 0
    assert [m.id for m in messages].index(stand_in.id) < messages.index(note)

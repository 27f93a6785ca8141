"""A compaction handoff never lands between a tool call and its result (issue 30, point 4)."""

from __future__ import annotations

import anyio
import pytest
from test_tasks_toolloop import Script, opened

from afterword.history import Message, ToolCall
from afterword.tasks import (
    HANDOFF_KIND,
    Compaction,
    CompactionRefused,
    ExecutionCoordinator,
    TaskNotifications,
    TurnRunner,
)
from afterword.tasks.turns import context_since_handoff


def orphan_results(context: list[Message]) -> list[str]:
    opened_ids: set[str] = set()
    orphans = []
    for message in context:
        if message.role == "tool" and message.tool_call_id not in opened_ids:
            orphans.append(message.id)
        opened_ids.update(message.call_ids())
    return orphans


@pytest.mark.anyio
async def test_a_handoff_during_a_tool_call_waits_for_the_result(state_dir: str) -> None:
    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        runner = TurnRunner(history, journal, notes, Script())
        coord = ExecutionCoordinator(journal, notes, runner)
        compaction = Compaction(journal, history, runner=runner)
        landed = anyio.Event()

        async def compact() -> None:
            await compaction.handoff("s", "summary", handoff_id="h1")
            landed.set()

        async with anyio.create_task_group() as tg, coord.turn("s") as turn:
            outcome = await turn.step(Message(id="u", role="user", content="go"))
            (call,) = outcome.replies[0].calls()
            tg.start_soon(compact)  # the host compacts while its tool runs
            await anyio.wait_all_tasks_blocked()  # compact() ran as far as it can
            assert not landed.is_set()
            await turn.commit_tool_result(Message(id="r", role="tool", content="ok", tool_call_id=call.id))
        ids = [m.id for m in await history.latest("s", 20)]
        assert ids.index("r") < ids.index("h1")
        context = await runner.context("s")
        assert context[0].meta.get("kind") == HANDOFF_KIND and not orphan_results(context)


@pytest.mark.anyio
async def test_a_handoff_while_a_call_is_open_is_refused_and_writes_nothing(state_dir: str) -> None:
    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        runner = TurnRunner(history, journal, notes, Script())
        coord = ExecutionCoordinator(journal, notes, runner)
        # A host with its own loop outside the coordinator left a call open.
        await history.append(
            "s", [Message(id="a", role="assistant", content="", tool_calls=(ToolCall(id="c"),))]
        )
        with pytest.raises(CompactionRefused):
            await Compaction(journal, history, runner=runner).handoff("s", "summary", handoff_id="h1")
        async with coord.turn("s") as turn:
            with pytest.raises(CompactionRefused):
                await turn.compact("summary", handoff_id="h2")
            await turn.commit_tool_result(Message(id="r", role="tool", content="ok", tool_call_id="c"))
            handoff = await turn.compact("summary", handoff_id="h2")
        assert [m.id for m in await history.latest("s", 20)] == ["a", "r", handoff.id]


def test_the_context_never_starts_with_a_result_without_its_call() -> None:
    # What an older version could leave: a handoff between a call and its result, and a window
    # that cut a call off from its result.
    call = Message(id="a", role="assistant", content="", tool_calls=(ToolCall(id="c"),))
    handoff = Message(id="h", role="user", content="summary", meta={"kind": HANDOFF_KIND})
    result = Message(id="r", role="tool", content="ok", tool_call_id="c")
    tail = [Message(id="u", role="user", content="next")]
    assert [m.id for m in context_since_handoff([call, handoff, result, *tail])] == ["h", "u"]
    assert [m.id for m in context_since_handoff([result, *tail])] == ["u"]
    assert [m.id for m in context_since_handoff([call, result, *tail])] == ["a", "r", "u"]

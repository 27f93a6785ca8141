"""A session never wedges, and when it cannot move on the host hears of it (issue 30).

Point 3: a turn closes every call it opened, also at the tool-round limit; the background
loop passes automatic turns, new notifications and stalls to the host's ``on_event``.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from test_tasks_toolloop import Script, Tools, opened

from afterword.history import Message, ToolCall, open_tool_calls
from afterword.tasks import (
    NOTIFICATION_KIND,
    ExecutionCoordinator,
    SessionEvent,
    TaskNotifications,
    ToolResult,
    TurnRunner,
    core,
)


class Looping:
    """A model that calls a tool at every step, forever."""

    def __init__(self) -> None:
        self.n = 0

    async def __call__(self, session_id: str, context: Sequence[Message]) -> list[Message]:
        self.n += 1
        call = ToolCall(id=f"{session_id}-loop{self.n}", name="inspect", arguments="{}")
        return [Message(id=f"{session_id}-m{self.n}", role="assistant", content="", tool_calls=(call,))]


@pytest.mark.anyio
async def test_the_round_limit_closes_the_calls_it_did_not_run(state_dir: str) -> None:
    """Issue 30, point 3: a turn at max_tool_rounds used to leave its last call open, and every
    later wake answered tool_call_open."""
    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        runner = TurnRunner(history, journal, notes, Looping())
        coord = ExecutionCoordinator(journal, notes, runner, tools=Tools(journal), max_tool_rounds=2)
        result = await coord.user_turn("s", Message(id="u", role="user", content="go"))
        assert len(result.steps) == 3 and result.stopped == "max_tool_rounds" and result.open_calls == ()
        last = result.tool_results[-1]
        assert last.meta.get("is_error") is True and "limit of 2 tool rounds" in last.content
        messages = await history.latest("s", 50)
        assert not open_tool_calls(messages) and messages[-1].id == last.id
        assert (await coord.wake("s")).reason == "nothing_pending"  # not tool_call_open


@pytest.mark.anyio
async def test_a_session_that_cannot_advance_tells_the_host(state_dir: str) -> None:
    """Without an executor an automatic turn leaves its call for the host: the background loop
    reports the turn, then that the session is stalled, instead of discarding both."""
    events: list[SessionEvent] = []
    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        runner = TurnRunner(history, journal, notes, Script())
        coord = ExecutionCoordinator(journal, notes, runner, on_event=events.append)
        first = await coord.user_turn("s", Message(id="u", role="user", content="go"))
        (call,) = first.open_calls
        await coord.processor.commit_tool_result(
            "s", Message(id="r", role="tool", content="started", tool_call_id=call.id)
        )
        await journal.create(
            core.new_task(
                task_id="t1",
                session_id="s",
                tool_call_id="other",
                command=["make"],
                notify="on_exit",
                cwd=None,
                output_path=journal.output_path("t1"),
                now=1.0,
            )
        )
        await journal.update(
            "t1", lambda t: core.prepare_commit(t, tool_result_id="r1", reported_terminal=False)
        )
        await history.append(
            "s",
            [
                Message(id="a-other", role="assistant", content="", tool_calls=(ToolCall(id="other"),)),
                Message(id="r1", role="tool", content="started", tool_call_id="other"),
            ],
        )
        await journal.update("t1", lambda t: core.commit(t, now=1.5))
        async with anyio.create_task_group() as tg:
            await tg.start(coord.run)
            await journal.update(
                "t1", lambda t: core.terminate(t, core.Outcome(state="exited", exit_code=0), now=2.0)
            )
            with anyio.fail_after(10):
                while not any(e.kind == "automatic_turn" for e in events):
                    await anyio.sleep(0.01)
            await coord.set_goal("s", "active")  # posts a wake: it finds the automatic turn's call open
            with anyio.fail_after(10):
                while not any(e.kind == "stalled" for e in events):
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    kinds = [e.kind for e in events]
    assert kinds.index("notifications") < kinds.index("automatic_turn") < kinds.index("stalled")
    (note,) = next(e for e in events if e.kind == "notifications").messages
    assert note.meta.get("kind") == NOTIFICATION_KIND
    auto = next(e for e in events if e.kind == "automatic_turn").turn
    assert auto is not None and [c.name for c in auto.open_calls] == ["inspect"]
    assert next(e for e in events if e.kind == "stalled").reason == "tool_call_open"


class FailsAfterTool(Script):
    """Like :class:`Script`, but the first step after a tool result fails (a provider error)."""

    failures: int = 1

    async def __call__(self, session_id: str, context: Sequence[Message]) -> list[Message]:
        if context[-1].role == "tool" and self.failures > 0:
            self.failures -= 1
            raise RuntimeError("provider timeout")
        return await super().__call__(session_id, context)


@pytest.mark.anyio
async def test_a_turn_whose_later_step_fails_keeps_the_notification(state_dir: str) -> None:
    """Issue 30, point 5: the first step (which called a tool about the notification) used to
    mark the task consumed although the turn's answer never came."""
    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        model = FailsAfterTool()
        tools = Tools(journal)
        coord = ExecutionCoordinator(journal, notes, TurnRunner(history, journal, notes, model), tools=tools)
        model.failures = 0
        await coord.user_turn("s", Message(id="u", role="user", content="go"))
        assert tools.task_id is not None
        model.failures = 1
        await journal.update(
            tools.task_id, lambda t: core.terminate(t, core.Outcome(state="failed", exit_code=2), now=2.0)
        )
        woke = await coord.wake("s")
        assert woke.ran and woke.outcome is not None and not woke.outcome.succeeded
        assert woke.outcome.consumed == ()
        task = journal.require(tools.task_id)
        assert task.delivered and not task.consumed
        assert task.continuation_error is not None and "provider timeout" in task.continuation_error
        retry = await coord.wake("s")  # what the background loop's retry does
        assert retry.ran and retry.outcome is not None and retry.outcome.succeeded
        assert retry.outcome.consumed == (tools.task_id,)
        assert journal.require(tools.task_id).consumed


@pytest.mark.anyio
async def test_a_tool_that_reports_an_end_too_early_keeps_its_answer(state_dir: str) -> None:
    """Issue 30, point 8: the false report made user_turn raise InvalidTransition and replaced
    the tool's answer with "interrupted"."""

    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        tools = Tools(journal)

        async def eager(session_id: str, call: ToolCall) -> ToolResult:
            started = await tools(session_id, call)
            if call.name != "start":
                return started
            assert tools.task_id is not None
            return ToolResult(content="the build passed", reported_terminal=(tools.task_id, "task_not_mine"))

        coord = ExecutionCoordinator(
            journal, notes, TurnRunner(history, journal, notes, Script()), tools=eager
        )
        result = await coord.user_turn("s", Message(id="u", role="user", content="go"))
        assert result.succeeded and [m.content for m in result.tool_results] == ["the build passed"]
        assert tools.task_id is not None
        task = journal.require(tools.task_id)
        assert task.committed and task.handed_off and task.terminal_reported is None
        await journal.update(
            tools.task_id, lambda t: core.terminate(t, core.Outcome(state="exited", exit_code=0), now=2.0)
        )
        woke = await coord.wake("s")  # so the real end is notified and handled
        assert woke.ran and woke.outcome is not None and woke.outcome.consumed == (tools.task_id,)


@pytest.mark.anyio
async def test_tasks_ending_together_get_one_automatic_turn(state_dir: str) -> None:
    """Issue 30, point 9: ten ends within 80 ms gave 2-4 turns. The background loop now waits
    a window after a session's first change; the window is stepped here, not timed."""
    events: list[SessionEvent] = []
    window_open = anyio.Event()
    window_passes = anyio.Event()

    async def window(seconds: float) -> None:
        window_open.set()
        await window_passes.wait()

    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        model = Script()
        coord = ExecutionCoordinator(
            journal,
            notes,
            TurnRunner(history, journal, notes, model),
            tools=Tools(journal),
            on_event=events.append,
            sleep=window,
        )
        ids = [f"t{i}" for i in range(10)]
        for task_id in ids:
            await journal.create(
                core.new_task(
                    task_id=task_id,
                    session_id="s",
                    tool_call_id="c",
                    command=["make"],
                    notify="on_exit",
                    cwd=None,
                    output_path=journal.output_path(task_id),
                    now=1.0,
                )
            )
        await history.append(
            "s", [Message(id="a", role="assistant", content="", tool_calls=(ToolCall(id="c"),))]
        )
        await coord.processor.commit_tool_result(
            "s", Message(id="r", role="tool", content="started", tool_call_id="c")
        )
        async with anyio.create_task_group() as tg:
            await tg.start(coord.run)
            await window_open.wait()  # the commit opened the session's window
            for task_id in ids:  # ten ends while it is open
                await journal.update(
                    task_id, lambda t: core.terminate(t, core.Outcome(state="exited", exit_code=0), now=2.0)
                )
            window_passes.set()
            with anyio.fail_after(10):
                while not all(journal.require(t).consumed for t in ids) or coord.busy("s"):
                    await anyio.sleep(0.01)
            # The window no longer waits: any further (wrong) wake runs to its answer before
            # every task is blocked again.
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    turns = [e for e in events if e.kind == "automatic_turn"]
    assert len(turns) == 1 and turns[0].turn is not None and sorted(turns[0].turn.consumed) == ids
    (batch,) = [e for e in events if e.kind == "notifications"]
    assert len(batch.messages) == 10


@pytest.mark.anyio
async def test_a_tool_answer_too_large_to_store_is_replaced_and_the_turn_goes_on(state_dir: str) -> None:
    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)

        async def huge(session_id: str, call: ToolCall) -> ToolResult:
            return ToolResult(content="x" * (4 * 1024 * 1024))  # past the store's record bound

        coord = ExecutionCoordinator(
            journal, notes, TurnRunner(history, journal, notes, Script()), tools=huge
        )
        result = await coord.user_turn("s", Message(id="u", role="user", content="go"))
        assert result.succeeded and result.replies[-1].content == "done"
        (stand_in,) = result.tool_results
        assert "could not be recorded" in stand_in.content and "MessageTooLarge" in stand_in.content
        assert not open_tool_calls(await history.latest("s", 20))


@pytest.mark.anyio
async def test_a_session_whose_model_keeps_failing_tells_the_host(state_dir: str) -> None:
    events: list[SessionEvent] = []

    async def broken(session_id: str, context: Sequence[Message]) -> list[Message]:
        raise RuntimeError("provider down")

    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        runner = TurnRunner(history, journal, notes, broken, max_model_failures=2)
        coord = ExecutionCoordinator(
            journal, notes, runner, on_event=events.append, retry_delay=lambda n: 0.0, coalesce_window=0.0
        )
        await journal.create(
            core.new_task(
                task_id="t1",
                session_id="s",
                tool_call_id="c",
                command=["make"],
                notify="on_exit",
                cwd=None,
                output_path=journal.output_path("t1"),
                now=1.0,
            )
        )
        await history.append(
            "s", [Message(id="a", role="assistant", content="", tool_calls=(ToolCall(id="c"),))]
        )
        await coord.processor.commit_tool_result(
            "s", Message(id="r", role="tool", content="started", tool_call_id="c")
        )
        async with anyio.create_task_group() as tg:
            await tg.start(coord.run)
            await journal.update(
                "t1", lambda t: core.terminate(t, core.Outcome(state="exited", exit_code=0), now=2.0)
            )
            with anyio.fail_after(10):
                while not any(e.kind == "stalled" for e in events):
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    turns = [e for e in events if e.kind == "automatic_turn"]
    assert len(turns) == 2 and all(
        e.turn is not None and not e.turn.succeeded for e in turns
    )  # the retry ran
    (stalled,) = [e for e in events if e.kind == "stalled"]
    assert stalled.reason == "retries_exhausted"

"""One model step at a time per session, and the tool loop inside the coordinator (issue 21,
items 2 and 3).

The schedule test runs a user's turn (model -> tool that starts a background task -> model),
the task's end, the coordinator's background loop and extra wakes concurrently; the model and
the tool yield a seeded random number of times, so each seed is one interleaving.
``AFTERWORD_INTERLEAVINGS`` raises the number of seeded schedules (default 150).
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import msgspec
import pytest

from afterword.disk import NoSyncDisk
from afterword.history import DurableHistory, Message, ToolCall, open_tool_calls
from afterword.history.durable import StoredMessage
from afterword.store import RecordStore
from afterword.tasks import (
    NOTIFICATION_KIND,
    ExecutionCoordinator,
    TaskJournal,
    TaskNotifications,
    ToolResult,
    TurnRunner,
    core,
    tool_result_id,
)
from tests._disk_helpers import SMALL

SCHEDULES = int(os.environ.get("AFTERWORD_INTERLEAVINGS", "150"))


async def yields(rng: random.Random, most: int = 5) -> None:
    for _ in range(rng.randrange(most + 1)):
        await anyio.sleep(0)


@dataclass
class Script:
    """A model that calls ``start`` for user input, ``inspect`` for a notification, and answers
    in text after a tool result. Counts how many steps run at once."""

    rng: random.Random = field(default_factory=lambda: random.Random(0))
    active: int = 0
    most_active: int = 0
    steps: int = 0
    trace: list[str] = field(default_factory=list)
    gate: anyio.Event | None = None

    async def __call__(self, session_id: str, context: Sequence[Message]) -> list[Message]:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        self.steps += 1
        n = self.steps
        try:
            self.trace.append(f"step{n}<")
            if self.gate is not None:
                await self.gate.wait()
            await yields(self.rng)
            last = context[-1]
            if last.role == "tool":
                reply = Message(id=f"{session_id}-m{n}", role="assistant", content="done")
            elif last.meta.get("kind") == NOTIFICATION_KIND:
                call = ToolCall(id=f"{session_id}-inspect{n}", name="inspect", arguments='{"what": "log"}')
                reply = Message(id=f"{session_id}-m{n}", role="assistant", content="", tool_calls=(call,))
            elif last.role == "user":
                call = ToolCall(id=f"{session_id}-start{n}", name="start", arguments='{"cmd": ["make"]}')
                reply = Message(id=f"{session_id}-m{n}", role="assistant", content="", tool_calls=(call,))
            else:
                reply = Message(id=f"{session_id}-m{n}", role="assistant", content="nothing new")
            self.trace.append(f">step{n}")
            return [reply]
        finally:
            self.active -= 1


@dataclass
class Tools:
    """The host's tool executor: ``start`` records a background task for the call."""

    journal: TaskJournal
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    calls: list[ToolCall] = field(default_factory=list)
    started: anyio.Event = field(default_factory=anyio.Event)
    task_id: str | None = None

    async def __call__(self, session_id: str, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        await yields(self.rng)
        if call.name == "start":
            self.task_id = f"task_{session_id}"
            await self.journal.create(
                core.new_task(
                    task_id=self.task_id,
                    session_id=session_id,
                    tool_call_id=call.id,
                    command=["make"],
                    notify="on_exit",
                    cwd=None,
                    output_path=self.journal.output_path(self.task_id),
                    now=1.0,
                )
            )
            self.started.set()
            await yields(self.rng)
            return ToolResult(content="started in the background")
        return ToolResult(content="the log says: ok")


@asynccontextmanager
async def opened(state_dir: str) -> AsyncIterator[tuple[TaskJournal, DurableHistory]]:
    store = RecordStore.open(state_dir, disk=NoSyncDisk(), options=SMALL)
    try:
        yield TaskJournal(store), DurableHistory(store)
    finally:
        store.close()


def well_formed(messages: list[Message]) -> None:
    """Every call answered, nothing between a call and its result, no two replies in a row."""
    assert not open_tool_calls(messages)
    for index, message in enumerate(messages):
        if message.meta.get("kind") == NOTIFICATION_KIND:
            assert not open_tool_calls(messages[:index]), [m.id for m in messages]
        if index and message.role == "assistant":
            assert messages[index - 1].role != "assistant", [m.id for m in messages]


@pytest.mark.anyio
async def test_every_model_step_is_serialized_under_seeded_schedules(state_dir: str) -> None:
    traces: set[tuple[str, ...]] = set()
    async with opened(state_dir) as (journal, history):
        model = Script()
        notes = TaskNotifications(journal, history)
        runner = TurnRunner(history, journal, notes, model)
        tools = Tools(journal)
        coord = ExecutionCoordinator(journal, notes, runner, tools=tools, retry_delay=lambda n: 0.0)
        async with anyio.create_task_group() as loop:
            await loop.start(coord.run)
            for seed in range(SCHEDULES):
                rng = random.Random(seed)
                model.rng, tools.rng = random.Random(seed * 2 + 1), random.Random(seed * 2 + 2)
                model.trace = []
                tools.started = anyio.Event()
                session = f"s{seed}"

                async def process(rng: random.Random = rng, session: str = session) -> None:
                    await tools.started.wait()
                    await yields(rng, 12)
                    model.trace.append("task-ends")
                    await journal.update(
                        f"task_{session}",
                        lambda t: core.terminate(t, core.Outcome(state="exited", exit_code=0), now=2.0),
                    )

                async def poke(rng: random.Random = rng, session: str = session) -> None:
                    for _ in range(3):
                        await yields(rng, 8)
                        result = await coord.wake(session)
                        model.trace.append(f"wake:{result.reason}")

                async with anyio.create_task_group() as tg:
                    tg.start_soon(process)
                    tg.start_soon(poke)
                    result = await coord.user_turn(
                        session, Message(id=f"{session}-u", role="user", content="go")
                    )
                assert result.succeeded and result.steps[0].replies[0].calls()[0].name == "start"
                task_id = f"task_{session}"
                with anyio.fail_after(10):
                    while not journal.require(task_id).consumed or coord.busy(session):
                        await anyio.sleep(0.001)
                messages = await history.latest(session, 100)
                well_formed(messages)
                assert sum(1 for m in messages if m.meta.get("kind") == NOTIFICATION_KIND) == 1
                traces.add(tuple(model.trace))
            loop.cancel_scope.cancel()
    assert model.most_active == 1  # never two model steps at once
    print(f"\n{SCHEDULES} seeded schedules, {len(traces)} distinct step/wake/task-end orders")
    assert len(traces) > SCHEDULES // 3


@pytest.mark.anyio
async def test_a_direct_step_and_a_wake_never_run_at_once(state_dir: str) -> None:
    """The host's own step (TurnRunner.run_turn) and a wake used to take different locks."""
    async with opened(state_dir) as (journal, history):
        model = Script(gate=anyio.Event())
        notes = TaskNotifications(journal, history)
        runner = TurnRunner(history, journal, notes, model)
        coord = ExecutionCoordinator(journal, notes, runner)
        await history.append("s", [Message(id="u", role="user", content="hi")])
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run_turn, "s")
            while model.active == 0:
                await anyio.sleep(0)
            woke = await coord.wake("s")
            model.gate.set()
        assert woke.reason == "busy" and model.most_active == 1
        with pytest.raises(RuntimeError, match="step lock"):
            await runner.step("s")  # a step outside the lock is refused, not run


@pytest.mark.anyio
async def test_an_automatic_turn_runs_its_tool_calls_and_returns_what_it_produced(state_dir: str) -> None:
    async with opened(state_dir) as (journal, history):
        model = Script()
        notes = TaskNotifications(journal, history)
        runner = TurnRunner(history, journal, notes, model)
        tools = Tools(journal)
        coord = ExecutionCoordinator(journal, notes, runner, tools=tools)
        first = await coord.user_turn("s", Message(id="u", role="user", content="go"))
        assert [len(s.replies) for s in first.steps] == [1, 1] and first.replies[-1].content == "done"
        assert tools.task_id is not None
        await journal.update(
            tools.task_id, lambda t: core.terminate(t, core.Outcome(state="failed", exit_code=2), now=2.0)
        )
        woke = await coord.wake("s")
        assert woke.ran and woke.outcome is not None
        auto = woke.outcome
        # model -> inspect tool -> model, all inside the automatic turn
        assert [c.name for c in auto.steps[0].replies[0].calls()] == ["inspect"]
        assert auto.steps[0].replies[0].calls()[0].arguments == '{"what": "log"}'
        assert [m.content for m in auto.tool_results] == ["the log says: ok"]
        assert auto.tool_results[0].id == tool_result_id(auto.steps[0].replies[0].calls()[0].id)
        assert auto.replies[-1].content == "done" and auto.open_calls == ()
        assert auto.consumed == (tools.task_id,)
        well_formed(await history.latest("s", 50))
        assert (await coord.wake("s")).reason == "nothing_pending"  # nothing left open or pending


@pytest.mark.anyio
async def test_without_an_executor_the_turn_reports_its_open_calls(state_dir: str) -> None:
    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        coord = ExecutionCoordinator(journal, notes, TurnRunner(history, journal, notes, Script()))
        result = await coord.user_turn("s", Message(id="u", role="user", content="go"))
        assert [c.name for c in result.open_calls] == ["start"]
        async with coord.turn("s") as turn:  # the host answers and continues under the lock
            assert coord.busy("s") and (await coord.wake("s")).reason == "busy"
            call = result.open_calls[0]
            await turn.commit_tool_result(Message(id="r", role="tool", content="ok", tool_call_id=call.id))
            assert (await turn.step()).replies[0].content == "done"


@pytest.mark.anyio
async def test_a_failing_or_interrupted_tool_still_closes_its_call(state_dir: str) -> None:
    async with opened(state_dir) as (journal, history):
        notes = TaskNotifications(journal, history)
        runner = TurnRunner(history, journal, notes, Script())

        async def broken(session_id: str, call: ToolCall) -> ToolResult:
            raise OSError("disk on fire")

        coord = ExecutionCoordinator(journal, notes, runner, tools=broken)
        result = await coord.user_turn("s", Message(id="u", role="user", content="go"))
        assert result.tool_results[0].meta.get("is_error") is True
        assert "OSError: disk on fire" in result.tool_results[0].content
        well_formed(await history.latest("s", 50))

        hang = anyio.Event()

        async def stuck(session_id: str, call: ToolCall) -> ToolResult:
            await hang.wait()
            raise AssertionError("unreachable")

        coord2 = ExecutionCoordinator(journal, notes, runner, tools=stuck)
        with anyio.move_on_after(0.2):
            await coord2.user_turn("s2", Message(id="u2", role="user", content="go"))
        messages = await history.latest("s2", 50)
        assert not open_tool_calls(messages) and messages[-1].role == "tool"
        assert not journal.control("s2").turn_open  # the marker is cleared even when cut short


def test_tool_calls_carry_name_and_arguments_and_old_records_still_read() -> None:
    call = ToolCall(id="c1", name="run", arguments='{"cmd": "make"}')
    message = Message(id="a", role="assistant", content="", tool_calls=(call,))
    stored = StoredMessage(conversation_id="s", seq=0, message=message)
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(stored), type=StoredMessage)
    assert again.message.calls() == (call,)
    # A record written before tool calls had names: a list of bare ids.
    old = msgspec.msgpack.encode(
        {
            "conversation_id": "s",
            "seq": 0,
            "message": {"id": "a", "role": "assistant", "content": "", "tool_calls": ["c1", "c2"]},
        }
    )
    legacy = msgspec.msgpack.decode(old, type=StoredMessage).message
    assert legacy.call_ids() == ("c1", "c2") and legacy.calls()[0] == ToolCall(id="c1")
    assert open_tool_calls([legacy]) == {"c1", "c2"}

"""TurnRunner, compaction handoff and ExecutionCoordinator: consumed only after a successful step,
references kept on failure, one turn per wake, and suppression of automatic continuation."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import pytest

from afterword.history import DurableHistory, Message
from afterword.store import RecordStore, StoreOptions
from afterword.tasks import (
    NOTIFICATION_KIND,
    Compaction,
    ExecutionCoordinator,
    ProcessSupervisor,
    TaskJournal,
    TaskNotifications,
    ToolCallProcessor,
    TurnRunner,
    notification_id_for,
)
from afterword.wal import WalOptions

OPTIONS = StoreOptions(wal=WalOptions(segment_size=4 * 1024 * 1024, max_payload=1024 * 1024, zero_fill=False))
S = "session-1"


class Model:
    """A scripted model step: records every context it sees; may fail or block."""

    def __init__(self, *, fail: float = 0) -> None:
        self.fail = fail  # how many upcoming calls raise (math.inf: all)
        self.calls: list[list[Message]] = []
        self.gate: anyio.Event | None = None
        self.entered = anyio.Event()

    async def __call__(self, session_id: str, context: Sequence[Message]) -> list[Message]:
        self.calls.append(list(context))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail > 0:
            self.fail -= 1
            raise RuntimeError("model unavailable")
        return [Message(id=f"reply-{len(self.calls)}", role="assistant", content="noted")]


@dataclass
class Stack:
    store: RecordStore
    journal: TaskJournal
    history: DurableHistory
    notes: TaskNotifications
    tools: ToolCallProcessor
    sup: ProcessSupervisor
    runner: TurnRunner
    coord: ExecutionCoordinator
    model: Model


@asynccontextmanager
async def stack(state_dir: str, model: Model | None = None, **coord_kw: object) -> AsyncIterator[Stack]:
    model = model or Model()
    store = RecordStore.open(state_dir, options=OPTIONS)
    try:
        journal, history = TaskJournal(store), DurableHistory(store)
        notes, tools = TaskNotifications(journal, history), ToolCallProcessor(journal, history)
        runner = TurnRunner(history, journal, notes, model, max_model_failures=3)
        coord = ExecutionCoordinator(journal, notes, runner, **coord_kw)  # type: ignore[arg-type]
        async with ProcessSupervisor(journal, kill_grace=2.0, on_exit="stop") as sup:
            yield Stack(store, journal, history, notes, tools, sup, runner, coord, model)
    finally:
        store.close()


async def handed_off(s: Stack, n: int, command: Sequence[str] = ("true",), wait: bool = True) -> str:
    """The model calls a tool that starts a background command; the result hands it off."""
    call = f"call-{n}"
    await s.history.append(S, [Message(id=f"a{n}", role="assistant", content="", tool_calls=(call,))])
    task = await s.sup.start(S, call, list(command))
    await s.tools.commit_tool_result(S, Message(id=f"r{n}", role="tool", content="bg", tool_call_id=call))
    if wait:
        await s.sup.wait(task.task_id, timeout=30)
    return task.task_id


def note_id(s: Stack, task_id: str) -> str:
    return notification_id_for(s.journal.require(task_id).event_id or "")


def user(n: int) -> Message:
    return Message(id=f"u{n}", role="user", content=f"user says {n}")


# -- TurnRunner ---------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_race_notification_written_then_model_sampling_fails(state_dir: str) -> None:
    async with stack(state_dir, Model(fail=1)) as s:
        tid = await handed_off(s, 1)
        out = await s.runner.run_turn(S)
        assert not out.succeeded and out.delivered == (tid,) and out.seen == (tid,)
        assert s.model.calls[0][-1].id == note_id(s, tid)  # the model was shown it
        task = s.journal.require(tid)
        assert task.delivered and not task.consumed  # delivered is not "handled"
        assert task.continuation_error == "RuntimeError: model unavailable"
        assert [t.task_id for t in await s.runner.pending(S)] == [tid]  # the reference is kept
    async with stack(state_dir) as s:  # the next life: recovery, then a good step
        assert await s.notes.deliver(S) == []  # the original notification is found, not rewritten
        out = await s.runner.run_turn(S)
        assert out.succeeded and out.consumed == (tid,)
        task = s.journal.require(tid)
        assert task.consumed and task.continuation_error is None
        messages = await s.history.latest(S, 50)
        assert [m.id for m in messages if m.meta.get("kind") == NOTIFICATION_KIND] == [note_id(s, tid)]
        assert messages[-1].id == "reply-1"


@pytest.mark.anyio
async def test_consumed_only_after_the_step_and_its_reply_are_durable(state_dir: str) -> None:
    async with stack(state_dir) as s:
        tid = await handed_off(s, 1)
        s.model.gate = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.runner.run_turn, S)
            await s.model.entered.wait()
            mid = s.journal.require(tid)
            assert mid.delivered and not mid.consumed  # in the model's context, not yet handled
            s.model.gate.set()
        assert s.journal.require(tid).consumed
        assert s.history.has_message(S, "reply-1")


@pytest.mark.anyio
async def test_compaction_carries_active_and_unconsumed_references(state_dir: str) -> None:
    async with stack(state_dir, Model()) as s:
        done = await handed_off(s, 1)
        assert (await s.runner.run_turn(S)).consumed == (done,)
        s.model.fail = 1
        unconsumed = await handed_off(s, 2)
        assert not (await s.runner.run_turn(S)).succeeded
        active = await handed_off(s, 3, ["sleep", "60"], wait=False)
        compaction = Compaction(s.journal, s.history)
        handoff = await compaction.handoff(S, "Summary of earlier work.", handoff_id="c1")
        assert handoff.meta["task_refs"] == " ".join(sorted([unconsumed, active]))
        assert unconsumed in handoff.content and active in handoff.content and done not in handoff.content
        context = await s.runner.context(S)
        assert context[0].id == "c1" and note_id(s, unconsumed) not in {m.id for m in context}
        out = await s.runner.run_turn(S)  # the summary replaced the notification; the ref survived
        assert out.succeeded and out.consumed == (unconsumed,)
        assert s.model.calls[-1][0].id == "c1"
        assert s.journal.require(active).state == "running" and not s.journal.require(active).consumed


# -- ExecutionCoordinator -------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_an_idle_session_is_woken_for_exactly_one_turn(state_dir: str) -> None:
    async with stack(state_dir) as s:
        first, second = await handed_off(s, 1), await handed_off(s, 2)
        result = await s.coord.wake(S)
        assert result.ran and result.outcome is not None
        assert sorted(result.outcome.consumed) == sorted([first, second])
        assert len(s.model.calls) == 1  # both notifications, one turn
        again = await s.coord.wake(S)
        assert not again.ran and again.reason == "nothing_pending"
        assert len(s.model.calls) == 1


@pytest.mark.anyio
async def test_a_wake_during_a_running_turn_does_not_start_another(state_dir: str) -> None:
    async with stack(state_dir) as s:
        await handed_off(s, 1)
        s.model.gate = anyio.Event()
        results = []
        async with anyio.create_task_group() as tg:

            async def wake() -> None:
                results.append(await s.coord.wake(S))

            tg.start_soon(wake)
            await s.model.entered.wait()
            busy = await s.coord.wake(S)
            assert not busy.ran and busy.reason == "busy"
            s.model.gate.set()
        assert results[0].ran and len(s.model.calls) == 1
        assert (await s.coord.wake(S)).reason == "nothing_pending"


@pytest.mark.anyio
async def test_interruption_suppresses_continuation_until_user_input(state_dir: str) -> None:
    async with stack(state_dir) as s:
        await s.coord.interrupt(S)
        tid = await handed_off(s, 1)
        result = await s.coord.wake(S)
        assert not result.ran and result.reason == "interrupted"
        assert s.journal.require(tid).delivered  # delivery still happened at the safe boundary
        assert s.model.calls == []
    async with stack(state_dir) as s:  # the interruption is durable
        assert (await s.coord.wake(S)).reason == "interrupted"
        out = await s.coord.user_turn(S, user(1))
        assert out.succeeded and out.consumed == (tid,)
        assert not s.journal.control(S).interrupted


@pytest.mark.anyio
async def test_interrupt_cancels_a_running_automatic_step(state_dir: str) -> None:
    async with stack(state_dir) as s:
        tid = await handed_off(s, 1)
        s.model.gate = anyio.Event()  # never set: the step hangs until interrupted
        results = []
        async with anyio.create_task_group() as tg:

            async def wake() -> None:
                results.append(await s.coord.wake(S))

            tg.start_soon(wake)
            await s.model.entered.wait()
            await s.coord.interrupt(S)
        assert not results[0].ran and results[0].reason == "interrupted"
        assert not s.journal.require(tid).consumed
        assert not s.history.has_message(S, "reply-1")


@pytest.mark.anyio
@pytest.mark.parametrize("goal", ["paused", "blocked"])
async def test_a_paused_or_blocked_goal_suppresses_continuation(state_dir: str, goal: str) -> None:
    async with stack(state_dir) as s:
        await s.coord.set_goal(S, goal)  # type: ignore[arg-type]
        tid = await handed_off(s, 1)
        result = await s.coord.wake(S)
        assert not result.ran and result.reason == f"goal_{goal}"
        assert s.model.calls == []
        await s.coord.set_goal(S, "active")
        resumed = await s.coord.wake(S)
        assert resumed.ran and resumed.outcome is not None and resumed.outcome.consumed == (tid,)


@pytest.mark.anyio
async def test_exhausted_model_retries_stop_until_new_user_input(state_dir: str) -> None:
    async with stack(state_dir, Model(fail=math.inf)) as s:
        tid = await handed_off(s, 1)
        for _ in range(3):
            result = await s.coord.wake(S)
            assert result.ran and result.outcome is not None and not result.outcome.succeeded
        stopped = await s.coord.wake(S)
        assert not stopped.ran and stopped.reason == "retries_exhausted"
        assert len(s.model.calls) == 3
        task = s.journal.require(tid)
        assert task.delivered and not task.consumed and task.continuation_error
    async with stack(state_dir, Model()) as s:
        assert (await s.coord.wake(S)).reason == "retries_exhausted"  # durable across restart
        out = await s.coord.user_turn(S, user(1))
        assert out.succeeded and out.consumed == (tid,)
        assert s.journal.control(S).model_failures == 0 and not s.journal.control(S).awaiting_user


class PendingSleeps:
    """The coordinator's sleep (its coalescing window and retry delay), counting the waits
    still running: with none left and every task blocked, no wake is on its way."""

    def __init__(self) -> None:
        self.pending = 0

    async def __call__(self, seconds: float) -> None:
        self.pending += 1
        try:
            await anyio.sleep(seconds)
        finally:
            self.pending -= 1

    async def quiet(self, s: Stack) -> None:
        """Return once the background loop has nothing left to do for the session."""
        with anyio.fail_after(30):
            while True:
                await anyio.wait_all_tasks_blocked()
                if self.pending == 0 and not s.coord.busy(S):
                    return
                await anyio.sleep(0.005)


@pytest.mark.anyio
async def test_background_loop_continues_once_when_a_task_ends(state_dir: str) -> None:
    sleeps = PendingSleeps()
    async with stack(state_dir, sleep=sleeps) as s, anyio.create_task_group() as tg:
        await tg.start(s.coord.run)
        tid = await handed_off(s, 1, ["sleep", "0.2"], wait=False)
        with anyio.fail_after(30):
            while not s.journal.require(tid).consumed:
                await anyio.sleep(0.01)
        await sleeps.quiet(s)  # a wrongly repeated wake would have run by now
        assert len(s.model.calls) == 1
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_background_loop_retries_failed_steps_then_stops(state_dir: str) -> None:
    sleeps = PendingSleeps()
    async with stack(state_dir, Model(fail=math.inf), retry_delay=lambda n: 0.01, sleep=sleeps) as s:
        async with anyio.create_task_group() as tg:
            await tg.start(s.coord.run)
            await handed_off(s, 1)
            with anyio.fail_after(30):
                while not s.journal.control(S).awaiting_user:
                    await anyio.sleep(0.01)
            await sleeps.quiet(s)  # a (wrong) fourth attempt would have run by now
            tg.cancel_scope.cancel()
        assert len(s.model.calls) == 3


@pytest.mark.anyio
async def test_retention_prunes_only_settled_tasks(state_dir: str) -> None:
    async with stack(state_dir, Model()) as s:
        done = await handed_off(s, 1)
        assert (await s.runner.run_turn(S)).consumed == (done,)
        s.model.fail = 1
        unconsumed = await handed_off(s, 2)
        await s.runner.run_turn(S)
        active = await handed_off(s, 3, ["sleep", "60"], wait=False)
        output = s.journal.require(done).output_path
        assert s.journal.root.exists(output)
        assert s.journal.root.exists(s.journal.exit_status_path(done))  # the wrapper's record
        ended_at = s.journal.require(done).ended_at or 0.0
        assert await s.journal.prune(now=ended_at + 10, keep_seconds=60) == []  # too recent
        assert await s.journal.prune(now=ended_at + 3600, keep_seconds=60) == [done]
        assert s.journal.get(done) is None and not s.journal.root.exists(output)
        assert not s.journal.root.exists(s.journal.exit_status_path(done))
        assert {t.task_id for t in s.journal.tasks(S)} == {unconsumed, active}


@pytest.mark.anyio
async def test_no_automatic_turn_while_a_tool_call_waits_or_for_a_reported_end(state_dir: str) -> None:
    async with stack(state_dir, Model(fail=1)) as s:
        tid = await handed_off(s, 1)
        assert not (await s.runner.run_turn(S)).succeeded  # delivered, unconsumed
        # The host's own loop has the model call a tool; its result is not in yet.
        await s.history.append(S, [Message(id="a9", role="assistant", content="", tool_calls=("call-9",))])
        waiting = await s.coord.wake(S)
        assert not waiting.ran and waiting.reason == "tool_call_open"
        # The tool waited for its own command and reported the end in its result.
        task = await s.sup.start(S, "call-9", ["true"])
        await s.sup.wait(task.task_id, 30)
        await s.tools.commit_tool_result(
            S,
            Message(id="r9", role="tool", content="exit 0", tool_call_id="call-9"),
            reported_terminal=[task.task_id],
        )
        assert [t.task_id for t in await s.runner.pending(S)] == [tid]  # the reported end is not pending
        result = await s.coord.wake(S)
        assert result.ran and result.outcome is not None
        assert sorted(result.outcome.consumed) == sorted([tid, task.task_id])  # the step saw both
        assert (await s.coord.wake(S)).reason == "nothing_pending"

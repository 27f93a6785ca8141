"""The safe boundary under concurrency (issue 21, item 1).

A notification must never land between an assistant's tool call and its result, even when the
call is reserved in the log but not yet durable at the moment ``deliver`` runs. The disk seam
here sleeps a seeded random time in every flush (in the WAL's worker thread), and each writer
yields a seeded random number of times, so every seed is a different interleaving of the
host's appends, their fsyncs and the delivery.

``AFTERWORD_INTERLEAVINGS`` raises the number of seeded schedules (default 150).
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from afterword.disk import NoSyncDisk
from afterword.history import DurableHistory, Message, open_tool_calls
from afterword.store import RecordStore, StoreOptions
from afterword.tasks import NOTIFICATION_KIND, TaskJournal, TaskNotifications, core
from tests._disk_helpers import SMALL

SCHEDULES = int(os.environ.get("AFTERWORD_INTERLEAVINGS", "150"))


class JitteryDisk(NoSyncDisk):
    """Flushes take a seeded random time, so appends stay in flight for a while."""

    def __init__(self) -> None:
        self.rng = random.Random(0)
        self.lock = threading.Lock()

    def _pause(self) -> None:
        with self.lock:
            delay = self.rng.choice([0.0, 0.0, 0.0005, 0.002, 0.005])
        time.sleep(delay)

    def fsync(self, fd: int) -> None:
        self._pause()

    def fdatasync(self, fd: int) -> None:
        self._pause()


@asynccontextmanager
async def opened(
    state_dir: str, disk: NoSyncDisk, options: StoreOptions = SMALL
) -> AsyncIterator[tuple[TaskJournal, DurableHistory]]:
    store = RecordStore.open(state_dir, disk=disk, options=options)
    try:
        yield TaskJournal(store), DurableHistory(store)
    finally:
        store.close()


async def ended_and_committed(journal: TaskJournal, session: str, task_id: str, result_id: str) -> None:
    """A task that ended and whose initial tool result is committed: eligible to notify."""
    await journal.create(
        core.new_task(
            task_id=task_id,
            session_id=session,
            tool_call_id="call-1",
            command=["true"],
            notify="on_exit",
            cwd=None,
            output_path=journal.output_path(task_id),
            now=1.0,
        )
    )
    await journal.update(
        task_id, lambda t: core.terminate(t, core.Outcome(state="exited", exit_code=0), now=2.0)
    )
    await journal.update(
        task_id, lambda t: core.prepare_commit(t, tool_result_id=result_id, reported_terminal=False)
    )
    await journal.update(task_id, lambda t: core.commit(t, now=3.0))


def misplaced(messages: list[Message]) -> bool:
    """True if a notification sits where a tool call is still waiting for its result."""
    for index, message in enumerate(messages):
        if message.meta.get("kind") == NOTIFICATION_KIND and open_tool_calls(messages[:index]):
            return True
    return False


async def yields(rng: random.Random) -> None:
    for _ in range(rng.randrange(6)):
        await anyio.sleep(0)


@pytest.mark.anyio
async def test_notification_never_lands_inside_an_in_flight_tool_call(state_dir: str) -> None:
    disk = JitteryDisk()
    outcomes: Counter[str] = Counter()
    async with opened(state_dir, disk) as (journal, history):
        notes = TaskNotifications(journal, history)
        for seed in range(SCHEDULES):
            rng = random.Random(seed)
            disk.rng.seed(seed)
            session = f"s{seed}"
            await history.append(
                session,
                [
                    Message(id="u1", role="user", content="run it"),
                    Message(id="a1", role="assistant", content="", tool_calls=("call-1",)),
                ],
            )
            await ended_and_committed(journal, session, f"task_{seed}", "r1")
            await history.append(
                session, [Message(id="r1", role="tool", content="started", tool_call_id="call-1")]
            )

            async def host(rng: random.Random = rng, session: str = session) -> None:
                await yields(rng)
                await history.append(
                    session, [Message(id="a2", role="assistant", content="", tool_calls=("call-2",))]
                )
                await yields(rng)
                await history.append(
                    session, [Message(id="r2", role="tool", content="ok", tool_call_id="call-2")]
                )

            async def notifier(rng: random.Random = rng, session: str = session) -> None:
                await yields(rng)
                await notes.deliver(session)

            async with anyio.create_task_group() as tg:
                tg.start_soon(host)
                tg.start_soon(notifier)
            first = await history.latest(session, 50)
            assert not misplaced(first), (seed, [m.id for m in first])
            await notes.deliver(session)  # the pairing is closed now: it must go in
            final = [m.id for m in await history.latest(session, 50)]
            assert sum(1 for m in final if m.startswith("task-notification:")) == 1
            assert journal.require(f"task_{seed}").delivered
            where = next(i for i, m in enumerate(final) if m.startswith("task-notification:"))
            outcomes["before a2" if where < final.index("a2") else "after r2"] += 1
            outcomes["at first try" if len(first) == 6 else "refused, then delivered"] += 1
    # Both placements and the refusal happened: the schedules really interleave.
    print(f"\n{SCHEDULES} seeded schedules: {dict(outcomes)}")
    assert outcomes["before a2"] and outcomes["after r2"] and outcomes["refused, then delivered"]


@pytest.mark.anyio
async def test_boundary_counts_a_reserved_but_not_durable_tool_call(state_dir: str) -> None:
    """The exact race of the issue: the call is reserved, its fsync has not finished."""
    gate = threading.Event()
    flushing = threading.Event()  # a flush has begun and waits on the gate

    class HeldDisk(NoSyncDisk):
        def fdatasync(self, fd: int) -> None:
            flushing.set()
            gate.wait(10)

        def fsync(self, fd: int) -> None:
            flushing.set()
            gate.wait(10)

    # The held flush must run off the loop (a zero inline bound): written inline (the default for a lone
    # commit on a fast disk) it would block the event loop until the gate's timeout, and the
    # boundary would be read only after the call was already durable.
    held_off_loop = StoreOptions(wal=dataclasses.replace(SMALL.wal, inline_commit_max_s=0.0))
    gate.set()
    async with opened(state_dir, HeldDisk(), held_off_loop) as (journal, history):
        notes = TaskNotifications(journal, history)
        await history.append("s", [Message(id="a1", role="assistant", content="", tool_calls=("call-1",))])
        await ended_and_committed(journal, "s", "task_x", "r1")
        await history.append("s", [Message(id="r1", role="tool", content="started", tool_call_id="call-1")])
        gate.clear()
        flushing.clear()
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                history.append, "s", [Message(id="a2", role="assistant", content="", tool_calls=("call-2",))]
            )
            # a2 is reserved and its flush is held at the gate
            assert await anyio.to_thread.run_sync(flushing.wait, 10)
            delivered = await notes.deliver("s")
            gate.set()
        assert delivered == []
        assert not journal.require("task_x").delivered
        await history.append("s", [Message(id="r2", role="tool", content="ok", tool_call_id="call-2")])
        assert [t.task_id for t in await notes.deliver("s")] == ["task_x"]
        ids = [m.id for m in await history.latest("s", 10)]
        assert ids[:4] == ["a1", "r1", "a2", "r2"] and ids[4].startswith("task-notification:")


@pytest.mark.anyio
async def test_append_at_boundary_refuses_while_open_and_writes_nothing(state_dir: str) -> None:
    async with opened(state_dir, NoSyncDisk()) as (_, history):
        await history.append("c", [Message(id="a", role="assistant", content="", tool_calls=("k",))])
        assert not await history.append_at_boundary("c", [Message(id="n", role="user", content="x")])
        assert not history.has_message("c", "n")
        await history.append("c", [Message(id="r", role="tool", content="", tool_call_id="k")])
        assert await history.append_at_boundary("c", [Message(id="n", role="user", content="x")])
        assert history.has_message("c", "n")

"""The task journal on ``Collection``: fail closed on a bad record, concurrent updates in order."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from afterword.store import Put, RecordStore, StoreOptions
from afterword.tasks import TaskJournalCorrupt, UnknownTaskError
from afterword.tasks.journal import TaskJournal, control_key, task_key
from afterword.tasks.records import TaskRecord
from afterword.wal import WalOptions

pytestmark = pytest.mark.anyio
OPTIONS = StoreOptions(
    wal=WalOptions(segment_size=1024 * 1024, max_payload=256 * 1024, zero_fill=False, unsafe_no_fsync=True)
)


def task(task_id: str, session: str = "s") -> TaskRecord:
    return TaskRecord(
        task_id=task_id,
        session_id=session,
        tool_call_id="c",
        command=("make",),
        created_at=1.0,
        output_path=f"tasks/{task_id}.out",
    )


async def test_bad_task_record_fails_closed_at_open_and_live(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        journal = TaskJournal(store)
        await journal.create(task("t1"))
        # A record whose body names another task is as untrustworthy as garbage.
        await store.transact([Put(task_key("t2"), msgspec.msgpack.encode(task("other")))])
        with pytest.raises(TaskJournalCorrupt, match="t2"):
            journal.get("t1")
        with pytest.raises(TaskJournalCorrupt):
            await journal.update("t1", lambda t: t)
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        with pytest.raises(TaskJournalCorrupt, match="task/t2"):
            TaskJournal(store)
        await store.transact([Put(task_key("t2"), msgspec.msgpack.encode(task("t2")))])
        await store.transact([Put(control_key("s"), b"\xc1")])
        with pytest.raises(TaskJournalCorrupt, match="taskctl/"):
            TaskJournal(store)


async def test_concurrent_updates_of_overlapping_tasks_all_land(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        journal, other = TaskJournal(store), TaskJournal(store)  # two journals share the locks
        for i in range(4):
            await journal.create(task(f"t{i}"))

        def bump(t: TaskRecord) -> TaskRecord:
            return msgspec.structs.replace(t, output_bytes=t.output_bytes + 1)

        async with anyio.create_task_group() as tg:
            for n in range(12):
                ids = [f"t{n % 4}", f"t{(n + 1) % 4}"][:: 1 if n % 2 else -1]
                tg.start_soon((journal if n % 3 else other).update_many, ids, bump)
        assert sorted(t.output_bytes for t in journal.tasks()) == [6, 6, 6, 6]
        with pytest.raises(UnknownTaskError):
            await journal.update("nope", bump)
        await journal.remove(["t0"])
        assert journal.get("t0") is None and other.get("t0") is None

"""``Collection[T]``: typed reads, one code path for replay and live commits, fail-closed
decoding, ordered keyed locks and expected-version updates."""

from __future__ import annotations

import random
from typing import Annotated, Literal

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from afterword.errors import StateError
from afterword.store import (
    Collection,
    CorruptRecordError,
    Delete,
    KeyedLocks,
    Put,
    RecordStore,
    StoreCorruptError,
    StoreOptions,
    VersionConflict,
)
from afterword.wal import WalOptions

OPTIONS = StoreOptions(
    wal=WalOptions(segment_size=1024 * 1024, max_payload=256 * 1024, zero_fill=False, unsafe_no_fsync=True)
)


class Job(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    state: str
    attempts: int = 0


_enc = msgspec.msgpack.Encoder()


class StateIndex:
    """A secondary index kept by ``on_change``: ids by state, and the order of events seen."""

    def __init__(self) -> None:
        self.by_state: dict[str, set[str]] = {}
        self.events: list[tuple[str, str | None, str | None]] = []

    def __call__(self, id_: str, old: Job | None, new: Job | None) -> None:
        if old is not None:
            self.by_state[old.state].discard(id_)
        if new is not None:
            self.by_state.setdefault(new.state, set()).add(id_)
        self.events.append((id_, old.state if old else None, new.state if new else None))

    def snapshot(self) -> dict[str, set[str]]:
        return {s: ids for s, ids in self.by_state.items() if ids}


pytestmark = pytest.mark.anyio


def test_typed_get_and_iteration(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        store.transact_sync([Put("job/a", _enc.encode(Job(state="queued"))), Put("other/x", b"not a job")])
        jobs = Collection(store, "job/", Job)
        assert jobs.get("a") == Job(state="queued") and jobs.get("missing") is None
        assert jobs["a"].state == "queued" and "a" in jobs and len(jobs) == 1
        store.transact_sync([Put("job/b", _enc.encode(Job(state="running", attempts=1)))])
        assert sorted(jobs) == ["a", "b"]
        assert dict(jobs.items())["b"] == Job(state="running", attempts=1)
        assert sorted(j.state for j in jobs.values()) == ["queued", "running"]
        assert jobs.version("b") == store.get("job/b").lsn  # type: ignore[union-attr]
        store.transact_sync([Delete("job/a")])
        assert list(jobs) == ["b"] and jobs.get("a") is None and jobs.version("a") is None
        assert "items=1" in repr(jobs)


async def test_replay_and_live_build_the_same_index(state_dir: str) -> None:
    """The index a live collection built equals the one rebuilt from checkpoint + WAL replay."""
    live = StateIndex()
    rng = random.Random(7)
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        jobs = Collection(store, "job/", Job, on_change=live)
        for step in range(60):
            ids = rng.sample([f"j{i}" for i in range(12)], 3)

            def change(cur: dict[str, Job | None], step: int = step) -> dict[str, Job | None]:
                out: dict[str, Job | None] = {}
                for i, job in cur.items():
                    roll = rng.random()
                    if job is None:
                        out[i] = Job(state="queued")
                    elif roll < 0.2:
                        out[i] = None
                    else:
                        out[i] = Job(
                            state=rng.choice(["queued", "running", "done"]), attempts=job.attempts + 1
                        )
                return out

            await jobs.update(ids, change)
            if step == 30:
                await store.checkpoint()  # half the history in record files, half in the log
        expected_items = dict(jobs.items())
        expected_index = live.snapshot()
    replayed = StateIndex()
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        assert store.replayed > 0
        again = Collection(store, "job/", Job, on_change=replayed)
        assert dict(again.items()) == expected_items
        assert replayed.snapshot() == expected_index
        # At open, every record is reported once as new; live changes then flow the same way.
        assert all(old is None for _, old, _ in replayed.events)
        await again.update(["j0"], lambda cur: {"j0": Job(state="archived")})
        assert replayed.events[-1][0] == "j0" and replayed.events[-1][2] == "archived"
        assert "j0" in replayed.by_state["archived"]


def test_garbage_at_open_raises_naming_the_key(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        store.transact_sync(
            [Put("job/ok", _enc.encode(Job(state="queued"))), Put("job/bad", b"\xc1 garbage")]
        )
        with pytest.raises(CorruptRecordError, match="job/bad") as info:
            Collection(store, "job/", Job)
        assert info.value.key == "job/bad"
        assert isinstance(info.value, StoreCorruptError) and isinstance(info.value, StateError)
        # A well-formed record of the wrong shape is as bad as garbage.
        store.transact_sync([Delete("job/bad"), Put("job/shape", _enc.encode({"state": 3}))])
        with pytest.raises(CorruptRecordError, match="job/shape"):
            Collection(store, "job/", Job)


def test_garbage_committed_live_fails_every_later_use(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        jobs = Collection(store, "job/", Job)
        store.transact_sync([Put("job/a", _enc.encode(Job(state="queued")))])
        store.transact_sync([Put("job/b", b"garbage")])  # durable; the collection cannot follow
        assert isinstance(jobs.corrupt, CorruptRecordError) and jobs.corrupt.key == "job/b"
        for use in (lambda: jobs.get("a"), lambda: list(jobs), lambda: len(jobs), jobs.items, jobs.values):
            with pytest.raises(CorruptRecordError, match="job/b"):
                use()
        # A later good commit does not make it trustworthy again.
        store.transact_sync([Delete("job/b")])
        with pytest.raises(CorruptRecordError):
            jobs.get("a")
        assert "corrupt" in repr(jobs)


async def test_update_refused_after_corruption_and_custom_error(state_dir: str) -> None:
    class MyCorrupt(StoreCorruptError):
        pass

    with RecordStore.open(state_dir, options=OPTIONS) as store:
        jobs = Collection(store, "job/", Job, error=lambda key, msg: MyCorrupt(f"mine: {msg}"))
        await store.transact([Put("job/x", b"nope")])
        with pytest.raises(MyCorrupt, match=r"mine: .*job/x"):
            await jobs.update(["y"], lambda cur: {"y": Job(state="queued")})
        assert store.get("job/y") is None


async def test_on_change_rejection_is_corruption(state_dir: str) -> None:
    def reject(id_: str, old: Job | None, new: Job | None) -> None:
        if new is not None and new.state == "bogus":
            raise ValueError("no such state")

    with RecordStore.open(state_dir, options=OPTIONS) as store:
        jobs = Collection(store, "job/", Job, on_change=reject)
        await jobs.update(["a"], lambda cur: {"a": Job(state="bogus")})
        with pytest.raises(CorruptRecordError, match=r"job/a.*no such state"):
            jobs.get("a")


class StrictJob(msgspec.Struct, frozen=True, kw_only=True):
    state: Literal["queued", "running"]
    attempts: Annotated[int, msgspec.Meta(ge=0)] = 0


@pytest.mark.parametrize(
    "bad",
    [
        StrictJob(state="queued", attempts=-1),  # a field constraint
        StrictJob(state="bogus", attempts=0),  # type: ignore[arg-type]  # a Literal
        StrictJob(state="queued", attempts="1"),  # type: ignore[arg-type]  # a type
    ],
)
async def test_a_value_built_here_that_would_not_decode_fails_closed(state_dir: str, bad: StrictJob) -> None:
    """msgspec checks types and constraints only when decoding, never when a Struct is built,
    so the collection decodes even the bytes it just encoded itself: a value the next open
    would refuse must not enter the index (keeping the caller's value instead would skip it)."""
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        jobs = Collection(store, "job/", StrictJob)
        await jobs.update(["ok"], lambda cur: {"ok": StrictJob(state="running")})
        await jobs.update(["a"], lambda cur: {"a": bad})  # durable before the check can run
        assert isinstance(jobs.corrupt, CorruptRecordError) and jobs.corrupt.key == "job/a"
        with pytest.raises(CorruptRecordError, match="job/a"):
            jobs.get("ok")
    with (
        RecordStore.open(state_dir, options=OPTIONS) as store,
        pytest.raises(CorruptRecordError, match="job/a"),
    ):
        Collection(store, "job/", StrictJob)  # replay refuses it the same way


async def test_update_conflicts_on_stale_expect(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        jobs = Collection(store, "job/", Job)
        await jobs.update(["a"], lambda cur: {"a": Job(state="queued")}, expect={"a": None})
        read = jobs.version("a")
        await jobs.update(["a"], lambda cur: {"a": Job(state="running")})
        with pytest.raises(VersionConflict) as info:
            await jobs.update(["a"], lambda cur: {"a": Job(state="done")}, expect={"a": read})
        assert info.value.key == "job/a" and info.value.expected == read
        assert jobs["a"].state == "running"  # nothing was written
        # Creating what exists conflicts too, even when nothing would change.
        with pytest.raises(VersionConflict):
            await jobs.update(["a"], lambda cur: {}, expect={"a": None})
        # A writer bypassing the locks between the read and the commit is caught as well.
        bypass_once = [True]

        def sneaky(cur: dict[str, Job | None]) -> dict[str, Job | None]:
            if bypass_once.pop():
                store.reserve([Put("job/a", _enc.encode(Job(state="stolen")))])
            return {"a": Job(state="mine")}

        with pytest.raises(VersionConflict):
            await jobs.update(["a"], sneaky)


async def test_update_validates_ids_and_extra_joins_the_transaction(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        jobs = Collection(store, "job/", Job)
        with pytest.raises(ValueError, match="not among the ids"):
            await jobs.update(["a"], lambda cur: {"b": Job(state="queued")})
        with pytest.raises(ValueError, match="not among the ids"):
            await jobs.update(["a"], lambda cur: {}, expect={"b": None})
        after = await jobs.update(["a"], lambda cur: {"a": Job(state="queued")}, extra=[Put("audit/1", b"x")])
        assert after == {"a": Job(state="queued")}
        assert store.get("audit/1").lsn == store.get("job/a").lsn  # type: ignore[union-attr]
        lsn = store.get("job/a").lsn  # type: ignore[union-attr]
        await jobs.update(["a"], lambda cur: {"a": cur["a"]})  # unchanged: no transaction
        assert jobs.version("a") == lsn
        await jobs.update(["a"], lambda cur: {"a": None})
        assert jobs.get("a") is None and store.get("job/a") is None


async def test_two_collections_on_one_prefix_share_locks(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        first, second = Collection(store, "job/", Job), Collection(store, "job/", Job)
        assert first.locks is second.locks
        assert Collection(store, "other/", Job).locks is not first.locks


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(
        st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4, unique=True), min_size=2, max_size=10
    ),
    seed=st.integers(0, 2**16),
)
def test_overlapping_updates_never_deadlock_or_lose_writes(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[str]], seed: int
) -> None:
    """Concurrent updates of overlapping id sets (in any order) all finish, and each increment
    lands: the ordered locks serialize writers of one id without a deadlock."""
    path = str(tmp_path_factory.mktemp("coll") / "state")

    async def main() -> None:
        rng = random.Random(seed)
        with RecordStore.open(path, options=OPTIONS) as store:
            jobs = Collection(store, "job/", Job)

            async def bump(ids: list[str]) -> None:
                order = ids[:]
                rng.shuffle(order)  # callers name ids in any order

                def inc(cur: dict[str, Job | None]) -> dict[str, Job | None]:
                    return {
                        i: Job(state="seen", attempts=(job.attempts if job else 0) + 1)
                        for i, job in cur.items()
                    }

                for _ in range(rng.randint(0, 2)):
                    await anyio.sleep(0)
                await jobs.update(order, inc)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for ids in batches:
                        tg.start_soon(bump, ids)
            expected: dict[str, int] = {}
            for ids in batches:
                for i in ids:
                    expected[i] = expected.get(i, 0) + 1
            assert {i: j.attempts for i, j in jobs.items()} == expected
            assert len(jobs.locks) == 0  # every lock entry was released

    anyio.run(main, backend="asyncio")


async def test_keyed_locks_order_and_single_key_form() -> None:
    locks = KeyedLocks()
    order: list[str] = []

    async def worker(name: str, keys: list[str]) -> None:
        async with locks.hold(keys):
            order.append(name)
            await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        one = locks.lock("a")
        async with one:
            assert one.locked() and locks.locked("a") and not locks.locked("b")
            tg.start_soon(worker, "w1", ["b", "a", "a"])
            tg.start_soon(worker, "w2", ["c"])
            await anyio.wait_all_tasks_blocked()  # both ran as far as they can
            assert order == ["w2"]  # w1 waits for "a"; w2 does not
            assert locks.locked("b") is False  # w1 takes "a" before "b": it holds nothing yet
            with pytest.raises(RuntimeError):
                await one.__aenter__()
    assert order == ["w2", "w1"]
    assert not locks.locked("a") and len(locks) == 0


async def test_keyed_locks_build_nothing_uncontended_and_still_exclude(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An uncontended hold builds no lock and no event (one dict entry); only a task that finds
    its key held waits on an event of its own, and exclusion is the same."""
    from afterword.store import keyed_locks as locks_module

    built = 0
    make = anyio.Event

    def counting() -> anyio.Event:
        nonlocal built
        built += 1
        return make()

    monkeypatch.setattr(locks_module.anyio, "Event", counting)
    monkeypatch.setattr(locks_module.anyio, "Lock", None)  # never needed
    locks = KeyedLocks()
    for i in range(200):  # one continuation after another, as a worker takes them
        async with locks.hold([f"k{i}"]):
            assert locks.locked(f"k{i}")
    assert built == 0 and len(locks) == 0
    inside: list[str] = []
    peak = 0

    async def writer(key: str) -> None:
        nonlocal peak
        async with locks.hold([key]):
            inside.append(key)
            peak = max(peak, inside.count(key))
            await anyio.sleep(0.001)
            inside.remove(key)

    async with anyio.create_task_group() as tg:
        for i in range(128):
            tg.start_soon(writer, f"k{i % 7}")
    assert peak == 1 and len(locks) == 0
    assert 0 < built <= 128 - 7  # the first holder of each key waited for nobody


async def test_keyed_locks_cancelled_waiters_neither_hold_nor_strand_the_key() -> None:
    """A waiter cancelled in the queue leaves it; one cancelled just as the key was handed to
    it passes the key on, so the next waiter still gets it and the pool empties."""
    locks = KeyedLocks()
    got: list[str] = []

    async def waiter(name: str) -> None:
        async with locks.lock("a"):
            got.append(name)

    with anyio.fail_after(5):  # a stranded key would hang the last waiter
        async with anyio.create_task_group() as tg:
            first = locks.lock("a")
            await first.__aenter__()
            with anyio.CancelScope() as gone:
                gone.cancel()
                await waiter("cancelled-before")  # cancelled while queued
            doomed = anyio.CancelScope()

            async def handed_then_cancelled() -> None:
                with doomed:
                    await waiter("handed")

            tg.start_soon(handed_then_cancelled)
            tg.start_soon(waiter, "next")
            await anyio.wait_all_tasks_blocked()  # both are queued for "a"
            doomed.cancel()  # the first queued waiter is cancelled, and before it runs ...
            await first.__aexit__(None, None, None)  # ... "a" is handed to it all the same
    assert got == ["next"]
    assert len(locks) == 0 and not locks.locked("a")

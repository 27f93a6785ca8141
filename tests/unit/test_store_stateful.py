"""Random transactions, checkpoints and reopens against an in-memory model of the store.

Segments are tiny so that the log rolls every few commits and the automatic checkpoint
(forced by the total log size) fires inside ordinary commits, including group commits.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile

import anyio
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from afterword.disk import NoSyncDisk
from afterword.store import (
    Delete,
    Mutation,
    Put,
    RecordStore,
    RecordTooLarge,
    StoreOptions,
    VersionConflict,
)
from afterword.wal import WalOptions

WAL = WalOptions(segment_size=4096, max_payload=1536, max_log_bytes=3 * 4096)
OPTIONS = StoreOptions(wal=WAL, max_record_bytes=1024, checkpoint_threads=2)
KEYS = ["a", "b", "c/1", "c/2", "d:x", "e"]

Model = dict[str, tuple[int, bytes]]  # key -> (version lsn, value)


DISK = NoSyncDisk()

keys = st.sampled_from(KEYS)
values = st.binary(max_size=200)
via = st.sampled_from(["sync", "async"])
mutation_lists = st.lists(
    st.tuples(keys, st.none() | values), min_size=1, max_size=4, unique_by=lambda kv: kv[0]
).map(lambda kvs: [Put(k, v) if v is not None else Delete(k) for k, v in kvs])


def snapshot(store: RecordStore) -> Model:
    return {r.key: (r.lsn, r.value) for r in store.items()}


def apply(model: Model, lsn: int, mutations: list[Mutation]) -> None:
    for m in mutations:
        if isinstance(m, Put):
            model[m.key] = (lsn, m.value)
        else:
            model.pop(m.key, None)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.parent = tempfile.mkdtemp(prefix="afterword-stateful-")
        os.chmod(self.parent, 0o700)
        self.path = os.path.join(self.parent, "state")
        self.store = RecordStore.open(self.path, disk=DISK, options=OPTIONS)
        self.model: Model = {}
        self.abandoned: list[RecordStore] = []
        self.tags = 0

    # -- helpers -----------------------------------------------------------------------------
    def commit(self, mutations: list[Mutation], how: str, expect: dict[str, int | None] | None = None) -> int:
        if how == "sync":
            return self.store.transact_sync(mutations, expect=expect)
        return anyio.run(functools.partial(self.store.transact, mutations, expect=expect))

    def version(self, key: str) -> int | None:
        entry = self.model.get(key)
        return entry[0] if entry is not None else None

    def assert_unchanged(self, next_lsn: int) -> None:
        assert snapshot(self.store) == self.model
        assert self.store.wal.next_lsn == next_lsn

    # -- transactions ------------------------------------------------------------------------
    @rule(key=keys, value=values, how=via)
    def put(self, key: str, value: bytes, how: str) -> None:
        mutations: list[Mutation] = [Put(key, value)]
        apply(self.model, self.commit(mutations, how), mutations)

    @rule(key=keys, how=via)
    def delete(self, key: str, how: str) -> None:
        mutations: list[Mutation] = [Delete(key)]
        apply(self.model, self.commit(mutations, how), mutations)

    @rule(mutations=mutation_lists, how=via, with_expect=st.booleans())
    def transaction(self, mutations: list[Mutation], how: str, with_expect: bool) -> None:
        expect = {m.key: self.version(m.key) for m in mutations} if with_expect else None
        apply(self.model, self.commit(mutations, how, expect), mutations)

    @rule(mutations=mutation_lists, key=keys, how=via, shift=st.sampled_from([-1, 1, None]))
    def conflicting_expectation(
        self, mutations: list[Mutation], key: str, how: str, shift: int | None
    ) -> None:
        actual = self.version(key)
        wrong: int | None
        if actual is None:
            wrong = 1 if shift is None else max(1, self.store.wal.next_lsn + shift)
        else:
            wrong = None if shift is None else actual + shift
        next_lsn = self.store.wal.next_lsn
        try:
            self.commit(mutations, how, {key: wrong})
        except VersionConflict as exc:
            assert (exc.key, exc.expected, exc.actual) == (key, wrong, actual)
        else:
            raise AssertionError("a wrong expectation committed")
        self.assert_unchanged(next_lsn)

    @rule(key=keys, how=via)
    def record_too_large(self, key: str, how: str) -> None:
        next_lsn = self.store.wal.next_lsn
        with pytest.raises(RecordTooLarge):
            self.commit([Put("a", b"ok"), Put(key if key != "a" else "b", b"x" * 1025)], how)
        self.assert_unchanged(next_lsn)

    @rule(tasks=st.lists(st.lists(mutation_lists, min_size=1, max_size=3), min_size=2, max_size=5))
    def concurrent_group(self, tasks: list[list[list[Mutation]]]) -> None:
        """Tasks commit sequences concurrently (sharing fsyncs, and reaching the automatic
        checkpoint while another task leads a write); lsn order decides the outcome."""
        done: list[tuple[int, list[Mutation]]] = []

        async def task(sequence: list[list[Mutation]]) -> None:
            for mutations in sequence:
                done.append((await self.store.transact(mutations), mutations))

        async def run() -> None:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for sequence in tasks:
                        tg.start_soon(task, sequence)

        anyio.run(run)
        assert len(done) == sum(map(len, tasks))
        for lsn, mutations in sorted(done, key=lambda item: item[0]):
            apply(self.model, lsn, mutations)

    @rule(
        tasks=st.lists(st.lists(mutation_lists, min_size=1, max_size=3), min_size=1, max_size=4),
        yields=st.integers(0, 8),
    )
    def cancelled_group(self, tasks: list[list[list[Mutation]]], yields: int) -> None:
        """A shutdown cancels committers mid-flight. Each transaction carries a tag record, so
        the store itself says which ones committed and at which lsn; every acknowledged one
        must be among them, and whatever the store shows must survive later reopens."""
        tagged: list[list[list[Mutation]]] = []
        for sequence in tasks:
            tagged.append([])
            for mutations in sequence:
                self.tags += 1
                tagged[-1].append([*mutations, Put(f"t/{self.tags}", b"")])
        acknowledged: list[int] = []

        async def task(sequence: list[list[Mutation]]) -> None:
            for mutations in sequence:
                acknowledged.append(await self.store.transact(mutations))

        async def run() -> None:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for sequence in tagged:
                        tg.start_soon(task, sequence)
                    for _ in range(yields):
                        await anyio.sleep(0)
                    tg.cancel_scope.cancel()

        anyio.run(run)
        committed = []
        for sequence in tagged:
            for mutations in sequence:
                tag = self.store.get(mutations[-1].key)
                if tag is not None:
                    committed.append((tag.lsn, mutations))
        committed.sort(key=lambda item: item[0])
        assert set(acknowledged) <= {lsn for lsn, _ in committed}
        assert self.store.wal.next_lsn - 1 == (committed[-1][0] if committed else self.store.wal.next_lsn - 1)
        for lsn, mutations in committed:
            apply(self.model, lsn, mutations)

    # -- checkpoints and reopening -----------------------------------------------------------
    @rule(how=via)
    def checkpoint(self, how: str) -> None:
        if how == "sync":
            self.store.checkpoint_sync()
        else:
            anyio.run(self.store.checkpoint)
        assert self.store.statistics().dirty == 0

    @rule(checkpoint_first=st.booleans())
    def reopen_clean(self, checkpoint_first: bool) -> None:
        if checkpoint_first:
            self.store.checkpoint_sync()
        self.store.close()
        self.store = RecordStore.open(self.path, disk=DISK, options=OPTIONS)

    @precondition(lambda self: len(self.abandoned) < 20)
    @rule()
    def reopen_after_abandoning(self) -> None:
        """The process "dies": the ownership lock goes, nothing is closed or checkpointed."""
        self.abandoned.append(self.store)
        lock = self.store._lock  # private on purpose: only the OS releases it in real life
        assert lock is not None
        lock.release()
        self.store = RecordStore.open(self.path, disk=DISK, options=OPTIONS)

    # -- the property ------------------------------------------------------------------------
    @invariant()
    def store_equals_model(self) -> None:
        assert snapshot(self.store) == self.model
        assert len(self.store) == len(self.model)
        assert self.store.wal.durable_lsn == self.store.wal.next_lsn - 1  # nothing left queued
        for key in KEYS:
            assert self.store.latest_version(key) == self.version(key)

    def teardown(self) -> None:
        try:
            self.store.close()
            for old in self.abandoned:
                old.wal.close()  # only the descriptors: its lock was already released
        finally:
            shutil.rmtree(self.parent, ignore_errors=True)


StoreMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreMachine = StoreMachine.TestCase


def test_options_make_the_log_roll_and_checkpoint_automatically(state_dir: str) -> None:
    """Guard for the machine above: its options must really exercise rolling and auto-checkpoint."""
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        for i in range(40):
            store.transact_sync([Put(KEYS[i % len(KEYS)], bytes([i]) * 200)])
        stats = store.statistics()
        assert stats.checkpoints > 0
        assert stats.wal_bytes <= WAL.max_log_bytes
        assert store.manifest.wal_start_seq > 1

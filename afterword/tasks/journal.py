"""``TaskJournal``: task and session-control records on the record store.

Keys: ``task/<task_id>`` and ``taskctl/<digest>`` (blake3 prefix of the session id; the real
id lives in the record). Every change is one WAL transaction made by applying a pure function
from :mod:`afterword.tasks.core` to the committed record; a per-key lock, shared by every
journal over the same store, keeps read-modify-write steps on one record in order while
commits on different records still share fsyncs. The in-memory index follows committed state
through ``RecordStore.watch``, so nothing is visible before it is durable.

Captured output lives beside the records as ``tasks/<task_id>.out`` under the store's
owner-only state root, read and written only through the disk seam; the command's recorded
exit status (written by the exit wrapper) as ``tasks/<task_id>.exit``.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager

import anyio
import blake3
import msgspec

from ..disk import StateRoot, UnsafeStateError
from ..store import Delete, Put, Record, RecordStore
from .core import settled
from .errors import TaskJournalCorrupt, UnknownTaskError
from .records import SessionControl, TaskRecord
from .render import OutputExcerpt

TASK_PREFIX = "task/"
CONTROL_PREFIX = "taskctl/"
OUTPUT_DIR = "tasks"
_log = logging.getLogger(__name__)
_TASK_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

_encoder = msgspec.msgpack.Encoder()
_task_decoder = msgspec.msgpack.Decoder(TaskRecord)
_control_decoder = msgspec.msgpack.Decoder(SessionControl)

Listener = Callable[[TaskRecord | None, TaskRecord | None], None]
_locks: weakref.WeakKeyDictionary[RecordStore, dict[str, anyio.Lock]] = weakref.WeakKeyDictionary()


def check_task_id(task_id: str) -> None:
    if not _TASK_ID_RE.match(task_id):
        raise ValueError(f"task id {task_id!r} must be 1-64 characters of [A-Za-z0-9_-]")


def task_key(task_id: str) -> str:
    return TASK_PREFIX + task_id


def control_key(session_id: str) -> str:
    return CONTROL_PREFIX + blake3.blake3(session_id.encode()).hexdigest()[:32]


class TaskJournal:
    """Durable task records and per-session control switches.

    Args:
        store: an open record store (keys under ``task/`` and ``taskctl/``).
    """

    def __init__(self, store: RecordStore) -> None:
        self.store = store
        self.root: StateRoot = store.root
        self._tasks: dict[str, TaskRecord] = {}
        self._by_session: dict[str, set[str]] = {}
        self._controls: dict[str, SessionControl] = {}
        self._listeners: list[Listener] = []
        self._corrupt: TaskJournalCorrupt | None = None
        self._loading = True
        # Existing records are indexed here; a bad one raises from the constructor.
        store.watch(TASK_PREFIX, self._guard(self._on_task))
        store.watch(CONTROL_PREFIX, self._guard(self._on_control))
        self._loading = False

    def _guard(self, fn: Callable[[str, Record | None, Record | None], None]) -> Callable[
        [str, Record | None, Record | None], None
    ]:
        def watcher(key: str, old: Record | None, new: Record | None) -> None:
            try:
                fn(key, old, new)
            except TaskJournalCorrupt as exc:
                if self._loading:
                    raise
                # Raising inside the store's apply loop would leave its memory half-applied;
                # the journal refuses its next use instead.
                self._corrupt = exc

        return watcher

    def _check(self) -> None:
        if self._corrupt is not None:
            raise self._corrupt

    # -- index (called by the store after each durable commit) ---------------------------------
    def _on_task(self, key: str, old: Record | None, new: Record | None) -> None:
        before = self._tasks.get(key[len(TASK_PREFIX) :])
        if new is None:
            if before is not None:
                del self._tasks[before.task_id]
                self._by_session.get(before.session_id, set()).discard(before.task_id)
            after = None
        else:
            try:
                after = _task_decoder.decode(new.value)
            except msgspec.DecodeError as exc:
                raise TaskJournalCorrupt(f"task record {key!r}: {exc}") from None
            if task_key(after.task_id) != key:
                raise TaskJournalCorrupt(f"task record {key!r} holds task {after.task_id!r}")
            self._tasks[after.task_id] = after
            self._by_session.setdefault(after.session_id, set()).add(after.task_id)
        for listener in list(self._listeners):
            try:
                listener(before, after)
            except Exception:  # a subscriber's bug must not break the store's apply loop
                _log.exception("task journal listener failed")

    def _on_control(self, key: str, old: Record | None, new: Record | None) -> None:
        if new is None:
            for sid in list(self._controls):
                if control_key(sid) == key:
                    del self._controls[sid]
            return
        try:
            control = _control_decoder.decode(new.value)
        except msgspec.DecodeError as exc:
            raise TaskJournalCorrupt(f"session control {key!r}: {exc}") from None
        if control_key(control.session_id) != key:
            raise TaskJournalCorrupt(f"session control {key!r} holds session {control.session_id!r}")
        self._controls[control.session_id] = control

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(before, after)`` after every durable task change; returns an unsubscribe."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    # -- reading -------------------------------------------------------------------------------
    def get(self, task_id: str) -> TaskRecord | None:
        self._check()
        return self._tasks.get(task_id)

    def require(self, task_id: str) -> TaskRecord:
        task = self.get(task_id)
        if task is None:
            raise UnknownTaskError(task_id)
        return task

    def tasks(self, session_id: str | None = None) -> list[TaskRecord]:
        """Tasks (of one session, or all), oldest first."""
        self._check()
        if session_id is None:
            found: Iterable[TaskRecord] = self._tasks.values()
        else:
            found = (self._tasks[t] for t in self._by_session.get(session_id, ()))
        return sorted(found, key=lambda t: (t.created_at, t.task_id))

    def sessions(self) -> list[str]:
        return sorted(s for s, ids in self._by_session.items() if ids)

    def controls(self) -> list[SessionControl]:
        """Every stored session control record."""
        self._check()
        return sorted(self._controls.values(), key=lambda c: c.session_id)

    def control(self, session_id: str) -> SessionControl:
        self._check()
        return self._controls.get(session_id) or SessionControl(session_id=session_id)

    # -- writing -------------------------------------------------------------------------------
    @asynccontextmanager
    async def _locked(self, keys: Sequence[str]) -> AsyncIterator[None]:
        per_store = _locks.setdefault(self.store, {})
        held: list[anyio.Lock] = []
        try:
            for key in sorted(set(keys)):  # one global order: no deadlock between batches
                lock = per_store.setdefault(key, anyio.Lock())
                await lock.acquire()
                held.append(lock)
            yield
        finally:
            for lock in reversed(held):
                lock.release()

    async def create(self, task: TaskRecord) -> TaskRecord:
        """Write a new task record (its id must be unused)."""
        check_task_id(task.task_id)
        key = task_key(task.task_id)
        async with self._locked([key]):
            await self.store.transact([Put(key, _encoder.encode(task))], expect={key: None})
        return task

    async def update(self, task_id: str, change: Callable[[TaskRecord], TaskRecord]) -> TaskRecord:
        """Apply ``change`` to the committed record and commit the result (if it differs)."""
        return (await self.update_many([task_id], change))[0]

    async def update_many(
        self, task_ids: Sequence[str], change: Callable[[TaskRecord], TaskRecord]
    ) -> list[TaskRecord]:
        """Apply ``change`` to several tasks in one atomic transaction."""
        keys = [task_key(t) for t in task_ids]
        async with self._locked(keys):
            before = [self.require(t) for t in task_ids]
            after = [change(t) for t in before]
            puts = [
                Put(task_key(a.task_id), _encoder.encode(a))
                for a, b in zip(after, before, strict=True)
                if a != b
            ]
            if puts:
                expect = {key: self._version(key) for key in keys}
                await self.store.transact(puts, expect=expect)
        return after

    async def update_control(
        self, session_id: str, change: Callable[[SessionControl], SessionControl]
    ) -> SessionControl:
        key = control_key(session_id)
        async with self._locked([key]):
            before = self.control(session_id)
            after = change(before)
            if after != before:
                await self.store.transact(
                    [Put(key, _encoder.encode(after))], expect={key: self._version(key)}
                )
        return after

    def _version(self, key: str) -> int | None:
        record = self.store.get(key)
        return record.lsn if record is not None else None

    async def remove(self, task_ids: Sequence[str]) -> None:
        """Delete task records and then their output files (retention)."""
        keys = [task_key(t) for t in task_ids]
        async with self._locked(keys):
            tasks = [self.require(t) for t in task_ids]
            await self.store.transact([Delete(k) for k in keys])
        for task in tasks:
            for rel in (task.output_path, self.exit_status_path(task.task_id)):
                if self.root.exists(rel):
                    self.root.remove(rel, sync_dir=False)
        if tasks and self.root.exists(OUTPUT_DIR):
            self.root.sync_dir(OUTPUT_DIR)

    async def prune(self, *, now: float, keep_seconds: float) -> list[str]:
        """Delete tasks settled for longer than ``keep_seconds`` (see ``core.settled``)."""
        stale = [t.task_id for t in self.tasks() if settled(t, now=now, keep_seconds=keep_seconds)]
        if stale:
            await self.remove(stale)
        return stale

    # -- captured output -----------------------------------------------------------------------
    @staticmethod
    def exit_status_path(task_id: str) -> str:
        """Where the exit-status wrapper records how the task's command ended."""
        check_task_id(task_id)
        return f"{OUTPUT_DIR}/{task_id}.exit"

    @staticmethod
    def output_path(task_id: str) -> str:
        check_task_id(task_id)
        return f"{OUTPUT_DIR}/{task_id}.out"

    def read_output_tail(self, task: TaskRecord, max_bytes: int) -> OutputExcerpt:
        """The last ``max_bytes`` of the captured output (fail-closed reads via the seam)."""
        try:
            handle = self.root.open_file(task.output_path)
        except UnsafeStateError as exc:
            if exc.rule != "missing":
                raise
            return OutputExcerpt(text="", excerpt_bytes=0, total_bytes=task.output_bytes,
                                 truncated=task.output_bytes > 0)
        try:
            size = self.root.disk.fstat(handle.fd).st_size
            take = min(size, max_bytes)
            data = self.root.pread(handle, take, size - take)
            self.root.check_identity(handle)
        finally:
            self.root.close(handle)
        total = max(task.output_bytes, size)
        return OutputExcerpt(
            text=data.decode("utf-8", errors="replace"),
            excerpt_bytes=len(data),
            total_bytes=total,
            truncated=len(data) < total or task.output_truncated,
        )

    def __repr__(self) -> str:
        return f"<TaskJournal tasks={len(self._tasks)} sessions={len(self.sessions())}>"

"""``TaskJournal``: task and session-control records on the record store.

Keys: ``task/<task_id>`` and ``taskctl/<digest>`` (blake3 prefix of the session id; the real
id lives in the record). Every change is one WAL transaction made by applying a pure function
from :mod:`afterword.tasks.core` to the committed record. Both key spaces are
collections (:class:`afterword.store.Collection`): their keyed locks, shared by every journal over the same
store, keep read-modify-write steps on one record in order while commits on different records
still share fsyncs; they follow committed state, so nothing is visible before it is durable;
and a record that does not decode makes the journal fail closed.

Captured output lives beside the records as ``tasks/<task_id>.out`` under the store's
owner-only state root, read and written only through the disk seam; the command's recorded
exit status (written by the exit wrapper) as ``tasks/<task_id>.exit``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence

import blake3

from ..disk import StateRoot, UnsafeStateError
from ..store import Collection, RecordStore
from .core import settled
from .errors import TaskJournalCorrupt, UnknownTaskError
from .records import SessionControl, TaskRecord
from .render import OutputChunk, OutputExcerpt

TASK_PREFIX = "task/"
CONTROL_PREFIX = "taskctl/"
OUTPUT_DIR = "tasks"
_log = logging.getLogger(__name__)
_TASK_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

Listener = Callable[[TaskRecord | None, TaskRecord | None], None]


def _corrupt(key: str, message: str) -> TaskJournalCorrupt:
    return TaskJournalCorrupt(message)


def _present(task_id: str, task: TaskRecord | None) -> TaskRecord:
    if task is None:
        raise UnknownTaskError(task_id)
    return task


def check_task_id(task_id: str) -> None:
    if not _TASK_ID_RE.match(task_id):
        raise ValueError(f"task id {task_id!r} must be 1-64 characters of [A-Za-z0-9_-]")


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character that is not complete."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): does its sequence fit?
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return back if need > back else 0
    return 0


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
        self._by_session: dict[str, set[str]] = {}
        self._controls: dict[str, SessionControl] = {}  # by session id (keys are digests)
        self._listeners: list[Listener] = []
        # Existing records are indexed here; a bad one raises from the constructor, and one
        # committed later makes every use of the journal raise.
        self._task_records = Collection(
            store, TASK_PREFIX, TaskRecord, on_change=self._on_task, error=_corrupt
        )
        self._control_records = Collection(
            store, CONTROL_PREFIX, SessionControl, on_change=self._on_control, error=_corrupt
        )

    def _check(self) -> None:
        self._task_records.check()
        self._control_records.check()

    # -- index (called after each durable commit) ----------------------------------------------
    def _on_task(self, task_id: str, before: TaskRecord | None, after: TaskRecord | None) -> None:
        if after is not None and after.task_id != task_id:
            raise TaskJournalCorrupt(f"task record {task_key(task_id)!r} holds task {after.task_id!r}")
        if before is not None:
            self._by_session.get(before.session_id, set()).discard(before.task_id)
        if after is not None:
            self._by_session.setdefault(after.session_id, set()).add(after.task_id)
        for listener in list(self._listeners):
            try:
                listener(before, after)
            except Exception:  # a subscriber's bug must not break the store's apply loop
                _log.exception("task journal listener failed")

    def _on_control(self, digest: str, before: SessionControl | None, after: SessionControl | None) -> None:
        if after is None:
            if before is not None:
                self._controls.pop(before.session_id, None)
            return
        if control_key(after.session_id) != CONTROL_PREFIX + digest:
            raise TaskJournalCorrupt(
                f"session control {CONTROL_PREFIX + digest!r} holds session {after.session_id!r}"
            )
        self._controls[after.session_id] = after

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(before, after)`` after every durable task change; returns an unsubscribe."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    # -- reading -------------------------------------------------------------------------------
    def get(self, task_id: str) -> TaskRecord | None:
        self._check()
        return self._task_records.get(task_id)

    def require(self, task_id: str) -> TaskRecord:
        task = self.get(task_id)
        if task is None:
            raise UnknownTaskError(task_id)
        return task

    def tasks(self, session_id: str | None = None) -> list[TaskRecord]:
        """Tasks (of one session, or all), oldest first."""
        self._check()
        if session_id is None:
            found: Iterable[TaskRecord] = self._task_records.values()
        else:
            found = (self._task_records[t] for t in self._by_session.get(session_id, ()))
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
    async def create(self, task: TaskRecord) -> TaskRecord:
        """Write a new task record (its id must be unused)."""
        check_task_id(task.task_id)
        tid = task.task_id
        await self._task_records.update([tid], lambda cur: {tid: task}, expect={tid: None})
        return task

    async def update(self, task_id: str, change: Callable[[TaskRecord], TaskRecord]) -> TaskRecord:
        """Apply ``change`` to the committed record and commit the result (if it differs)."""
        return (await self.update_many([task_id], change))[0]

    async def update_many(
        self, task_ids: Sequence[str], change: Callable[[TaskRecord], TaskRecord]
    ) -> list[TaskRecord]:
        """Apply ``change`` to several tasks in one atomic transaction."""
        self._check()

        def apply(current: dict[str, TaskRecord | None]) -> dict[str, TaskRecord | None]:
            return {t: change(_present(t, current[t])) for t in task_ids}

        after = await self._task_records.update(task_ids, apply)
        return [_present(t, after[t]) for t in task_ids]

    async def update_control(
        self, session_id: str, change: Callable[[SessionControl], SessionControl]
    ) -> SessionControl:
        self._check()
        digest = control_key(session_id)[len(CONTROL_PREFIX) :]

        def apply(current: dict[str, SessionControl | None]) -> dict[str, SessionControl | None]:
            return {digest: change(current[digest] or SessionControl(session_id=session_id))}

        after = await self._control_records.update([digest], apply)
        result = after[digest]
        assert result is not None
        return result

    async def remove(self, task_ids: Sequence[str]) -> None:
        """Delete task records and then their output files (retention)."""
        self._check()
        tasks: list[TaskRecord] = []

        def drop(current: dict[str, TaskRecord | None]) -> dict[str, TaskRecord | None]:
            tasks.extend(_present(t, current[t]) for t in task_ids)
            return dict.fromkeys(task_ids)

        await self._task_records.update(task_ids, drop)
        for task in tasks:
            for rel in (
                task.output_path,
                self.exit_status_path(task.task_id),
                self.cancel_request_path(task.task_id),
            ):
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
    def cancel_request_path(task_id: str) -> str:
        """Where ``afterword tasks cancel`` (another process) leaves a user's cancel request."""
        check_task_id(task_id)
        return f"{OUTPUT_DIR}/{task_id}.cancel"

    @staticmethod
    def output_path(task_id: str) -> str:
        check_task_id(task_id)
        return f"{OUTPUT_DIR}/{task_id}.out"

    def task_file_fault(self, task_id: str, exc: UnsafeStateError) -> str | None:
        """Why ``exc`` concerns only this task's own files, or None when it is the journal's.

        The command writes into its capture file and can reach it (``/proc/self/fd/1``): a
        chmod or a hard link there is the task's doing and may only fail that task. A rule
        broken by a directory, the log or another task's file stays the journal's fault.
        """
        own = {
            self.root.path(rel)
            for rel in (
                self.output_path(task_id),
                self.exit_status_path(task_id),
                self.cancel_request_path(task_id),
            )
        }
        if exc.path not in own or exc.rule == "missing":
            return None
        name = {".out": "output", ".exit": "exit status"}.get(
            exc.path[exc.path.rfind(".") :], "cancel request"
        )
        return f"its {name} file was changed from outside the journal ({exc.rule}) and is not trusted"

    def read_output_tail(self, task: TaskRecord, max_bytes: int) -> OutputExcerpt:
        """The last ``max_bytes`` of the captured output (fail-closed reads via the seam).

        A capture file the task itself tampered with reads as no output, with the reason in
        ``unavailable``; a fault of the journal's own state raises.
        """
        try:
            handle = self.root.open_file(task.output_path)
        except UnsafeStateError as exc:
            return self._no_output(task, exc)
        try:
            size = self.root.disk.fstat(handle.fd).st_size
            take = min(size, max_bytes)
            data = self.root.pread(handle, take, size - take)
            self.root.check_identity(handle)
        except UnsafeStateError as exc:
            return self._no_output(task, exc)
        finally:
            self.root.close(handle)
        total = max(task.output_bytes, size)
        return OutputExcerpt(
            text=data.decode("utf-8", errors="replace"),
            excerpt_bytes=len(data),
            total_bytes=total,
            truncated=len(data) < total or task.output_truncated,
        )

    def read_output(self, task: TaskRecord, offset: int, max_bytes: int) -> OutputChunk:
        """Up to ``max_bytes`` of captured output from byte ``offset`` on (see
        :class:`OutputChunk`); reading from ``next_offset`` each time gives what is new."""
        if offset < 0 or max_bytes < 1:
            raise ValueError("offset must be >= 0 and max_bytes >= 1")
        try:
            handle = self.root.open_file(task.output_path)
        except UnsafeStateError as exc:
            gone = self._no_output(task, exc)
            return OutputChunk(
                text="",
                offset=offset,
                next_offset=offset,
                total_bytes=gone.total_bytes,
                unavailable=gone.unavailable,
            )
        try:
            size = self.root.disk.fstat(handle.fd).st_size
            restarted = offset > size
            start = max(0, size - max_bytes) if restarted else offset
            data = self.root.pread(handle, min(max_bytes, size - start), start)
            self.root.check_identity(handle)
        except UnsafeStateError as exc:
            gone = self._no_output(task, exc)
            return OutputChunk(
                text="",
                offset=offset,
                next_offset=offset,
                total_bytes=gone.total_bytes,
                unavailable=gone.unavailable,
            )
        finally:
            self.root.close(handle)
        # A multi-byte character cut at the end is left for the next read.
        cut = _incomplete_tail(data) if task.state == "running" or len(data) == max_bytes else 0
        text = data[: len(data) - cut].decode("utf-8", errors="replace")
        return OutputChunk(
            text=text,
            offset=start,
            next_offset=start + len(data) - cut,
            total_bytes=max(task.output_bytes, size),
            restarted=restarted,
        )

    def _no_output(self, task: TaskRecord, exc: UnsafeStateError) -> OutputExcerpt:
        fault = self.task_file_fault(task.task_id, exc)
        if exc.rule != "missing" and fault is None:
            raise exc
        return OutputExcerpt(
            text="",
            excerpt_bytes=0,
            total_bytes=task.output_bytes,
            truncated=task.output_bytes > 0,
            unavailable=fault,
        )

    def __repr__(self) -> str:
        return f"<TaskJournal tasks={len(self._task_records)} sessions={len(self.sessions())}>"

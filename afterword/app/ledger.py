"""The write path every part of the app shares: per-record locks, commit, transition, notify.

Every state change goes through a pure lifecycle function and one WAL transaction. A
read-modify-write holds the record's lock so concurrent requests on one continuation
serialize, and the store's version check (``expect``) catches anything that slips past.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager

import anyio
import msgspec

from ..continuations.errors import NotFound
from ..continuations.model import Continuation, encode
from ..continuations.trail import record_change
from ..legacy.migrate import RollbackGuard
from ..store import Mutation, RecordStore
from .ports import ChangeListener
from .repository import LIVE, Repository

SETTLE_BATCH = 100  # records per settlement/recovery transaction, at most
RECORD_SLACK = 1024  # room per record for the change, the key and the framing


class WorkSignal:
    """Set after every committed change (and by the worker when it finishes a task); the
    worker waits on it between scans instead of polling."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = anyio.Event()

    async def wait(self, timeout_s: float) -> None:
        """Until the signal is set or ``timeout_s`` passes, whichever is first."""
        with anyio.move_on_after(timeout_s):
            await self._event.wait()


class Ledger:
    """Commits continuation records and tells listeners about each change."""

    def __init__(
        self, store: RecordStore, repo: Repository, rollback_guard: RollbackGuard, clock_ms: Callable[[], int]
    ) -> None:
        self.store = store
        self.repo = repo
        self.rollback_guard = rollback_guard
        self.clock_ms = clock_ms
        self.listeners: list[ChangeListener] = []
        self.work = WorkSignal()
        # Half the log's transaction bound: whatever a batch's sizing misses still fits.
        self.tx_budget = max(64 * 1024, store.options.wal.max_payload // 2)

    def locked(self, ids: Iterable[str]) -> AbstractAsyncContextManager[None]:
        """Hold the locks of ``ids`` from the repository's pool (taken in sorted order, so
        batches never deadlock)."""
        return self.repo.locks.hold(ids)

    def stored_size(self, cid: str) -> int:
        """The bytes a live record takes in a transaction, with room for the framing."""
        stored = self.store.get(LIVE + cid)
        return (len(stored.value) if stored is not None else 0) + RECORD_SLACK

    async def commit(
        self, pairs: Sequence[tuple[Continuation | None, Continuation]], *, extra: Sequence[Mutation] = ()
    ) -> None:
        """Commit new versions (create when old is None) in one transaction, then notify."""
        now = self.clock_ms()
        pairs = [(old, self._with_history(new, now)) for old, new in pairs]
        self.rollback_guard.ensure()  # before the first native v3 record becomes durable
        expect: dict[str, int | None] = {}
        for old, new in pairs:
            expect[LIVE + new.id] = None if old is None else self.repo.version(new.id)
        await self.store.transact([*(self.repo.put(new) for _, new in pairs), *extra], expect=expect)
        for old, new in pairs:
            for fn in self.listeners:
                fn(old, new)
            self.work.set()

    def _with_history(self, new: Continuation, now: int) -> Continuation:
        """``new`` with its state history carried forward, unless that history would be what
        pushes a near-limit record over the store's per-record limit: the history is for
        operators and must never be the reason a transition fails."""
        recorded = record_change(self.repo.get(new.id), new, now)
        limit = self.store.options.max_record_bytes
        if recorded.history and len(recorded.text or "") > limit // 2 and len(encode(recorded)) > limit:
            return msgspec.structs.replace(recorded, history=())
        return recorded

    async def transition(
        self, cid: str, fn: Callable[[Continuation], Continuation | None]
    ) -> tuple[Continuation, bool]:
        """Apply a pure transition to one record under its lock; returns (record, changed)."""
        async with self.locked([cid]):
            rec = self.repo.get(cid)
            if rec is None:
                raise NotFound(f"no continuation {cid}")
            new = fn(rec)
            if new is None or new == rec:
                return rec, False
            await self.commit([(rec, new)])
            return new, True

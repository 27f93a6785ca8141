"""Keyed locks: one lock per key, taken in sorted order so batches never deadlock.

This is the package's only lock pool. A read-modify-write of one or more records holds the
locks of their keys while it decides what to write, so two writers of the same record run one
after the other while writers of different records still share a group commit. Acquiring a
batch always in sorted key order is what makes overlapping batches safe: two tasks can never
each hold a lock the other is waiting for.

A key is held while it is in the pool's table; an uncontended hold is one dict entry and
nothing else (no lock object, no generator, no checkpoint: every holder awaits a commit inside
the block anyway). Only a task that finds its key held builds something: an event it waits
on. A release hands the key straight to the first waiter (first come, first served), or drops
the entry, so a pool keyed by ids that come and go (continuations, sessions) does not grow.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import anyio

__all__ = ["KeyLock", "KeyedLocks", "shared_locks"]


class KeyedLocks:
    """A pool of locks by key.

    ``async with locks.hold(["b", "a"]):`` takes ``a`` then ``b``; ``locks.lock("a")`` is the
    single-key form that also answers :meth:`KeyLock.locked`.
    """

    __slots__ = ("__weakref__", "_held")

    def __init__(self) -> None:
        # key -> the tasks waiting for it, in arrival order (None while nobody waits).
        self._held: dict[str, deque[anyio.Event] | None] = {}

    def hold(self, keys: Iterable[str]) -> _Hold:
        """Hold the lock of every key in ``keys`` (duplicates allowed) for the block."""
        return _Hold(self, keys)

    async def _acquire(self, key: str) -> None:
        held = self._held
        if key not in held:
            held[key] = None
            return
        waiters = held[key]
        if waiters is None:
            waiters = held[key] = deque()
        turn = anyio.Event()
        waiters.append(turn)
        try:
            await turn.wait()
        except BaseException:
            if turn.is_set():  # the key was handed over as we were cancelled: pass it on
                self._release(key)
            else:
                waiters.remove(turn)
            raise

    def _release(self, key: str) -> None:
        waiters = self._held[key]
        if waiters:
            waiters.popleft().set()  # the key stays held: it now belongs to that waiter
        else:
            del self._held[key]

    def lock(self, key: str) -> KeyLock:
        """The lock of one key, usable as ``async with`` and asked with ``locked()``."""
        return KeyLock(self, key)

    def locked(self, key: str) -> bool:
        """Whether someone holds ``key`` now."""
        return key in self._held

    def __len__(self) -> int:
        """Keys held or waited for right now."""
        return len(self._held)

    def __repr__(self) -> str:
        waiting = sum(len(w) for w in self._held.values() if w)
        return f"<KeyedLocks held={len(self._held)} waiting={waiting}>"


class _Hold:
    """One ``hold(keys)``: the keys are sorted and deduplicated once, when it is entered."""

    __slots__ = ("_acquired", "_keys", "_pool")

    def __init__(self, pool: KeyedLocks, keys: Iterable[str]) -> None:
        self._pool = pool
        self._keys = keys
        self._acquired: list[str] | None = None

    async def __aenter__(self) -> None:
        if self._acquired is not None:
            raise RuntimeError("a hold is entered once at a time; take a new one per use")
        keys = self._keys
        # One key (the usual case) needs neither the set nor the sort.
        ordered = keys if isinstance(keys, (list, tuple)) and len(keys) == 1 else sorted(set(keys))
        acquired: list[str] = []
        pool = self._pool
        try:
            for key in ordered:
                await pool._acquire(key)
                acquired.append(key)
        except BaseException:
            for key in reversed(acquired):
                pool._release(key)
            raise
        self._acquired = acquired

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        acquired, self._acquired = self._acquired, None
        if acquired:
            for key in reversed(acquired):
                self._pool._release(key)


class KeyLock:
    """One key of a :class:`KeyedLocks` pool (see :meth:`KeyedLocks.lock`)."""

    __slots__ = ("_entered", "key", "pool")

    def __init__(self, pool: KeyedLocks, key: str) -> None:
        self.pool = pool
        self.key = key
        self._entered = False

    def locked(self) -> bool:
        return self.pool.locked(self.key)

    async def __aenter__(self) -> None:
        if self._entered:
            raise RuntimeError("a KeyLock is entered once at a time; take a new one per use")
        await self.pool._acquire(self.key)
        self._entered = True

    async def __aexit__(self, *exc: Any) -> None:
        if self._entered:
            self._entered = False
            self.pool._release(self.key)


_shared: weakref.WeakKeyDictionary[Any, dict[str, KeyedLocks]] = weakref.WeakKeyDictionary()


def shared_locks(owner: object, name: str) -> KeyedLocks:
    """The pool called ``name`` of ``owner`` (a store), shared by everyone who asks.

    Two journals or histories opened over the same store must serialize on the same locks;
    the pool lives as long as the owner does.
    """
    pools = _shared.setdefault(owner, {})
    pool = pools.get(name)
    if pool is None:
        pool = pools[name] = KeyedLocks()
    return pool

"""Keyed locks: one anyio lock per key, taken in sorted order so batches never deadlock.

This is the package's only lock pool. A read-modify-write of one or more records holds the
locks of their keys while it decides what to write, so two writers of the same record run one
after the other while writers of different records still share a group commit. Acquiring a
batch always in sorted key order is what makes overlapping batches safe: two tasks can never
each hold a lock the other is waiting for.

Entries are reference-counted and dropped when nobody holds or waits for them, so a pool keyed
by ids that come and go (continuations, sessions) does not grow without bound.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import anyio

__all__ = ["KeyLock", "KeyedLocks", "shared_locks"]

SPARE_LOCKS = 64  # free locks a pool keeps for reuse


class KeyedLocks:
    """A pool of locks by key.

    ``async with locks.hold(["b", "a"]):`` takes ``a`` then ``b``; ``locks.lock("a")`` is the
    single-key form that also answers :meth:`KeyLock.locked`.
    """

    __slots__ = ("__weakref__", "_locks", "_spare", "_users")

    def __init__(self) -> None:
        self._locks: dict[str, anyio.Lock] = {}
        self._users: dict[str, int] = {}
        # Locks of keys nobody uses any more, free and unowned, for the next key: building an
        # anyio.Lock looks up the async backend each time (~2.5 us, several per continuation).
        self._spare: list[anyio.Lock] = []

    @asynccontextmanager
    async def hold(self, keys: Iterable[str]) -> AsyncIterator[None]:
        """Hold the lock of every key in ``keys`` (duplicates allowed) for the block."""
        ordered = sorted(set(keys))
        for key in ordered:
            self._users[key] = self._users.get(key, 0) + 1
        acquired: list[anyio.Lock] = []
        try:
            for key in ordered:
                lock = self._locks.get(key)
                if lock is None:
                    # An uncontended acquire need not yield to the loop: every holder awaits
                    # a commit inside the block anyway, and the yield cost ~3% of serve's loop.
                    spare = self._spare
                    lock = self._locks[key] = spare.pop() if spare else anyio.Lock(fast_acquire=True)
                await lock.acquire()
                acquired.append(lock)
            yield
        finally:
            for lock in reversed(acquired):
                lock.release()
            for key in ordered:
                left = self._users[key] - 1
                if left:
                    self._users[key] = left
                else:
                    del self._users[key]
                    lock = self._locks.pop(key)
                    if len(self._spare) < SPARE_LOCKS and not lock.locked():
                        self._spare.append(lock)

    def lock(self, key: str) -> KeyLock:
        """The lock of one key, usable as ``async with`` and asked with ``locked()``."""
        return KeyLock(self, key)

    def locked(self, key: str) -> bool:
        """Whether someone holds ``key`` now."""
        lock = self._locks.get(key)
        return lock is not None and lock.locked()

    def __len__(self) -> int:
        """Keys held or waited for right now."""
        return len(self._locks)

    def __repr__(self) -> str:
        held = sum(1 for lock in self._locks.values() if lock.locked())
        return f"<KeyedLocks keys={len(self._locks)} held={held}>"


class KeyLock:
    """One key of a :class:`KeyedLocks` pool (see :meth:`KeyedLocks.lock`)."""

    __slots__ = ("_cm", "key", "pool")

    def __init__(self, pool: KeyedLocks, key: str) -> None:
        self.pool = pool
        self.key = key
        self._cm: Any = None

    def locked(self) -> bool:
        return self.pool.locked(self.key)

    async def __aenter__(self) -> None:
        if self._cm is not None:
            raise RuntimeError("a KeyLock is entered once at a time; take a new one per use")
        cm = self.pool.hold((self.key,))
        await cm.__aenter__()
        self._cm = cm

    async def __aexit__(self, *exc: Any) -> None:
        cm, self._cm = self._cm, None
        await cm.__aexit__(*exc)


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

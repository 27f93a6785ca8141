"""``Collection[T]``: typed records under one key prefix of a :class:`RecordStore`.

A collection is an in-memory, always-current view of every record whose key starts with its
prefix, decoded into one msgspec ``Struct`` type. It follows the store through a watcher, so
the records found at open (checkpoint files plus WAL replay) and every later durable commit
reach it, and the caller's ``on_change`` hook, by the same path: an index built on top is the
same whether the state was replayed or written live, and nothing is visible before its
fsync.

A record that does not decode (or that ``on_change`` rejects) is never skipped. At
construction the error is raised; after that, because the commit is already durable, the
collection keeps the error and raises it from every later read and write (fail closed) until
the state is inspected and reopened. The error names the record's key.

Writes take the collection's keyed locks (one pool per store and prefix, acquired in sorted
order) and commit one store transaction whose expectations are the versions read under the
lock, so a writer that bypasses the locks gets :class:`~afterword.store.VersionConflict`
instead of overwriting a change it never saw.

Example::

    class Job(msgspec.Struct, frozen=True, kw_only=True):
        state: str
        attempts: int = 0

    jobs = Collection(store, "job/", Job)
    await jobs.update(["j1"], lambda cur: {"j1": Job(state="queued")}, expect={"j1": None})

    def start(cur):
        return {"j1": msgspec.structs.replace(cur["j1"], state="running")}

    await jobs.update(["j1"], start)
    assert jobs.get("j1").state == "running"
    running = [job_id for job_id, job in jobs.items() if job.state == "running"]
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

import msgspec

from ..errors import AfterwordError
from .errors import StoreCorruptError, VersionConflict
from .keyed_locks import KeyedLocks, shared_locks
from .store import Delete, Mutation, Put, Record, RecordStore

__all__ = ["Collection", "CorruptRecordError"]

T = TypeVar("T", bound=msgspec.Struct)
log = logging.getLogger("afterword.store")

_encoder = msgspec.msgpack.Encoder()

ChangeHook = Callable[[str, T | None, T | None], None]
"""``on_change(id, old, new)``: called after each durable change (and for each record found at
construction as ``(id, None, record)``). Raising marks the collection corrupt."""


class CorruptRecordError(StoreCorruptError):
    """A committed record under a collection's prefix cannot be decoded or indexed.

    ``key`` is the store key of the record. Every use of the collection raises this until the
    state directory is inspected and reopened.
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


def _default_error(key: str, message: str) -> Exception:
    return CorruptRecordError(key, message)


class Collection(Generic[T]):
    """Typed records of type ``T`` stored under ``prefix`` (see the module docstring).

    Args:
        store: the open record store.
        prefix: the key prefix, e.g. ``"job/"``; a record's id is its key without it.
        type_: the msgspec Struct every record decodes to (msgpack; the decoder is built once).
        on_change: optional ``fn(id, old, new)`` keeping the caller's secondary indexes.
        blobs: optional ``fn(value)`` naming the blobs a record references (kept alive by them).
        error: optional ``fn(key, message)`` building the error raised for a corrupt record,
            so each user keeps its own typed error. An :class:`~afterword.errors.AfterwordError`
            raised by ``on_change`` is kept as it is.
        locks: the lock pool; by default one shared by every collection on this store and prefix.

    Raises:
        CorruptRecordError: (or ``error``'s type) a stored record under ``prefix`` is bad.
    """

    def __init__(
        self,
        store: RecordStore,
        prefix: str,
        type_: type[T],
        *,
        on_change: ChangeHook[T] | None = None,
        blobs: Callable[[T], tuple[str, ...]] | None = None,
        error: Callable[[str, str], Exception] | None = None,
        locks: KeyedLocks | None = None,
    ) -> None:
        if not prefix:
            raise ValueError("a collection needs a non-empty key prefix")
        self.store = store
        self.prefix = prefix
        self.type = type_
        self.locks = locks if locks is not None else shared_locks(store, "collection:" + prefix)
        self._decoder = msgspec.msgpack.Decoder(type_)
        self._on_change = on_change
        self._blobs = blobs
        self._error = error or _default_error
        self._items: dict[str, T] = {}
        self._corrupt: Exception | None = None
        self._loading = True
        store.watch(prefix, self._watch)  # records already stored are reported (and checked) now
        self._loading = False

    # -- following the store -------------------------------------------------------------------
    def _watch(self, key: str, old: Record | None, new: Record | None) -> None:
        if self._corrupt is not None:
            return  # already refusing every use; later changes cannot make it trustworthy
        try:
            self._follow(key, new)
        except Exception as exc:
            if isinstance(exc, msgspec.DecodeError | msgspec.ValidationError):
                err = self._error(key, f"record {key!r} does not decode as {self.type.__name__}: {exc}")
            elif isinstance(exc, AfterwordError):
                err = exc
            else:
                err = self._error(key, f"record {key!r} cannot be indexed: {type(exc).__name__}: {exc}")
            if self._loading:
                raise err from None
            # The commit is durable; raising here would only be logged by the store. Keep the
            # error and refuse every later use instead.
            log.error("collection %r: %s", self.prefix, err)
            self._corrupt = err

    def _follow(self, key: str, new: Record | None) -> None:
        cid = key[len(self.prefix) :]
        before = self._items.get(cid)
        if new is None:
            if before is None:
                return
            del self._items[cid]
            after = None
        else:
            after = self._decoder.decode(new.value)
            self._items[cid] = after
        if self._on_change is not None:
            self._on_change(cid, before, after)

    def check(self) -> None:
        """Raise the stored error once a committed record could not be decoded or indexed."""
        if self._corrupt is not None:
            raise self._corrupt

    @property
    def corrupt(self) -> Exception | None:
        """The error every use raises, or None while the collection is sound."""
        return self._corrupt

    # -- reading -------------------------------------------------------------------------------
    def key(self, id_: str) -> str:
        """The store key of ``id_``."""
        return self.prefix + id_

    def get(self, id_: str) -> T | None:
        self.check()
        return self._items.get(id_)

    def __getitem__(self, id_: str) -> T:
        self.check()
        return self._items[id_]

    def __contains__(self, id_: object) -> bool:
        self.check()
        return id_ in self._items

    def __len__(self) -> int:
        self.check()
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        """The ids, as of the call (commits during the iteration do not disturb it)."""
        self.check()
        return iter(list(self._items))

    def items(self) -> list[tuple[str, T]]:
        self.check()
        return list(self._items.items())

    def values(self) -> list[T]:
        self.check()
        return list(self._items.values())

    def version(self, id_: str) -> int | None:
        """The committed version (lsn) of ``id_``; None when absent."""
        self.check()
        rec = self.store.get(self.key(id_))
        return rec.lsn if rec is not None else None

    # -- writing -------------------------------------------------------------------------------
    def put(self, id_: str, value: T) -> Put:
        """The mutation storing ``value`` as ``id_`` (for a transaction the caller composes)."""
        refs = self._blobs(value) if self._blobs is not None else ()
        return Put(self.key(id_), _encoder.encode(value), refs)

    def delete(self, id_: str) -> Delete:
        return Delete(self.key(id_))

    @asynccontextmanager
    async def locked(self, ids: Iterable[str]) -> AsyncIterator[None]:
        """Hold the locks of ``ids`` (taken in sorted order) for the block."""
        async with self.locks.hold(ids):
            self.check()
            yield

    async def update(
        self,
        ids: Sequence[str],
        fn: Callable[[dict[str, T | None]], Mapping[str, T | None]],
        *,
        expect: Mapping[str, int | None] | None = None,
        extra: Sequence[Mutation] = (),
    ) -> dict[str, T | None]:
        """Read ``ids``, apply ``fn``, commit what changed in one transaction; return the result.

        Under the locks of ``ids``, ``fn`` gets ``{id: current value or None}`` and returns the
        ids it changes: a value to store or None to delete (ids left out stay as they are; an
        id outside ``ids`` is a ``ValueError``). The transaction expects every id of ``ids``
        at the version read under the lock, or at the version given in ``expect`` (the caller
        read it earlier; None means absent). ``extra`` mutations join the same transaction.
        Returns the values after the commit, which is durable when this returns.

        Raises:
            VersionConflict: a record is not at the expected version (nothing was written).
        """
        wanted = list(dict.fromkeys(ids))
        async with self.locked(wanted):
            current = {i: self._items.get(i) for i in wanted}
            versions = {self.key(i): self.store.latest_version(self.key(i)) for i in wanted}
            for i, version in (expect or {}).items():
                if i not in current:
                    raise ValueError(f"expect names {i!r}, which is not among the ids updated")
                versions[self.key(i)] = version
            changes = fn(dict(current))
            mutations: list[Mutation] = []
            for i, value in changes.items():
                if i not in current:
                    raise ValueError(f"update changed {i!r}, which is not among the ids it locked")
                if value is None:
                    if current[i] is not None:
                        mutations.append(self.delete(i))
                elif value != current[i]:
                    mutations.append(self.put(i, value))
            if mutations or extra:
                await self.store.transact([*mutations, *extra], expect=versions)
            elif expect:
                # Nothing to write, but the caller's expectation still has to hold.
                for key, version in versions.items():
                    actual = self.store.latest_version(key)
                    if actual != version:
                        raise VersionConflict(key, version, actual)
            return {**current, **changes}

    def __repr__(self) -> str:
        state = " corrupt" if self._corrupt is not None else ""
        return f"<Collection {self.prefix!r} of {self.type.__name__} items={len(self._items)}{state}>"

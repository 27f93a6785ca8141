"""A durable at-least-once job queue on afterword's record store (public API only).

One record per job under ``job/<id>``, where ``id`` is derived from the caller's idempotency
key, so enqueueing the same key twice finds the same record. Every state change is one store
transaction with an expected version: the lease token *is* the version the lease committed,
so an ack or nack from a worker whose lease was taken over fails with :class:`LeaseLost`
instead of settling someone else's attempt. Acked jobs stay as small tombstones (payload
dropped) so a late duplicate enqueue is still recognised, until :meth:`JobQueue.purge`.
"""

from __future__ import annotations

import hashlib
import heapq
import time
from collections.abc import Callable
from typing import Literal

import msgspec

from afterword.disk import Disk
from afterword.store import Delete, Put, Record, RecordStore, StoreOptions, VersionConflict

PREFIX = "job/"
MAX_PAYLOAD = 64 * 1024  # keeps a lease (one job + up to 16 dead-letters) far below max_payload
State = Literal["ready", "leased", "done", "dead"]
Clock = Callable[[], int]  # milliseconds


class Job(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: str
    key: str  # the caller's idempotency key
    digest: str  # sha256 of the payload: a reused key with another payload is refused
    payload: bytes  # dropped (b"") once the job is done
    state: State
    attempts: int = 0
    due_ms: int  # ready: not before; leased: lease deadline; done/dead: when it settled
    seq: int  # enqueue order: due jobs are offered oldest first
    error: str = ""


_decode = msgspec.msgpack.Decoder(Job).decode
_encode = msgspec.msgpack.Encoder().encode


class QueueError(Exception):
    code = "invalid_request"


class NotFound(QueueError):
    code = "not_found"


class LeaseLost(QueueError):
    """The lease expired and was taken over, or the job was settled meanwhile."""

    code = "lease_lost"


class KeyReused(QueueError):
    code = "key_reused"


class TooLarge(QueueError):
    code = "too_large"


class QueueCorrupt(QueueError):
    """A stored job did not decode: the queue refuses to run on a state it cannot read."""

    code = "state_corrupt"


def job_id(key: str) -> str:
    if not key or len(key) > 200:
        raise QueueError("an idempotency key is 1-200 characters")
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class JobQueue:
    """Open with :meth:`open`; ``clock`` returns milliseconds (injected so tests can move time)."""

    def __init__(self, store: RecordStore, *, clock: Clock, max_attempts: int = 5, backoff_ms: int = 1000):
        self.store, self.clock = store, clock
        self.max_attempts, self.backoff_ms = max_attempts, backoff_ms
        self._jobs: dict[str, Job] = {}
        self._heap: list[tuple[int, int, str, int]] = []  # (due, seq, id, version): leasable
        self._seq = 0
        self._corrupt: QueueCorrupt | None = None
        self._loading = True
        store.watch(PREFIX, self._index)  # replays existing jobs first; a bad one raises here
        self._loading = False

    @classmethod
    def open(
        cls,
        path: str,
        *,
        disk: Disk | None = None,
        options: StoreOptions | None = None,
        clock: Clock | None = None,
        **kw: int,
    ) -> JobQueue:
        store = RecordStore.open(path, disk=disk, options=options)
        try:
            return cls(store, clock=clock or (lambda: int(time.time() * 1000)), **kw)
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        self.store.close()

    # -- the index, kept by the store's watcher after every durable commit ----------------------
    def _index(self, key: str, old: Record | None, new: Record | None) -> None:
        try:
            job = None if new is None else _decode(new.value)
            if job is not None and PREFIX + job.id != key:
                raise ValueError(f"holds job {job.id!r}")
        except (msgspec.DecodeError, ValueError) as exc:
            err = QueueCorrupt(f"job record {key!r} does not decode: {exc}")
            if self._loading:
                raise err from None
            self._corrupt = self._corrupt or err  # the store's apply loop must not raise
            return
        jid = key[len(PREFIX) :]
        if job is None:
            self._jobs.pop(jid, None)
            return
        assert new is not None
        self._jobs[jid] = job
        self._seq = max(self._seq, job.seq)
        if job.state in ("ready", "leased"):
            heapq.heappush(self._heap, (job.due_ms, job.seq, jid, new.lsn))

    def _check(self, write: bool = False) -> None:
        if self._corrupt is not None:
            raise self._corrupt
        if write:  # after a failed write or fsync nothing is answered until a reopen
            self.store.root.check_writable()

    def get(self, jid: str) -> Job | None:
        self._check()
        return self._jobs.get(jid)

    def list(self, state: State | None = None, limit: int = 1000) -> list[Job]:
        self._check()
        jobs = [j for j in self._jobs.values() if state is None or j.state == state]
        return sorted(jobs, key=lambda j: j.seq)[:limit]

    # -- operations -----------------------------------------------------------------------------
    async def enqueue(self, key: str, payload: bytes) -> tuple[Job, bool]:
        """Add a job once per idempotency key; returns ``(job, created)``."""
        self._check(write=True)
        if len(payload) > MAX_PAYLOAD:
            raise TooLarge(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
        jid, digest = job_id(key), hashlib.sha256(payload).hexdigest()
        while True:
            known = self._jobs.get(jid)
            if known is not None:
                if known.digest != digest:
                    raise KeyReused(f"key {key!r} was enqueued with another payload")
                return known, False
            self._seq += 1
            job = Job(
                id=jid,
                key=key,
                digest=digest,
                payload=payload,
                state="ready",
                due_ms=self.clock(),
                seq=self._seq,
            )
            try:
                await self.store.transact([Put(PREFIX + jid, _encode(job))], expect={PREFIX + jid: None})
                return job, True
            except VersionConflict:
                continue  # a concurrent enqueue of the same key won; answer with its job

    async def lease(self, lease_ms: int) -> tuple[Job, int] | None:
        """The next due job (a ready one, or a leased one whose lease expired) with its lease
        token, or None. A job out of attempts is dead-lettered in the same transaction."""
        while True:
            self._check(write=True)
            now, chosen = self.clock(), None
            dead: list[tuple[Job, int]] = []
            popped: list[tuple[int, int, str, int]] = []
            while self._heap and self._heap[0][0] <= now and chosen is None and len(dead) < 16:
                entry = heapq.heappop(self._heap)
                jid, version = entry[2], entry[3]
                if self.store.latest_version(PREFIX + jid) != version:
                    continue  # stale entry, or a commit to this job is in flight
                popped.append(entry)
                job = self._jobs[jid]
                if job.attempts >= self.max_attempts:
                    dead.append((job, version))
                else:
                    chosen = (job, version)
            if chosen is None and not dead:
                return None
            puts = [self._put(j, "dead", now, error=j.error or "lease expired") for j, _ in dead]
            expect: dict[str, int | None] = {PREFIX + j.id: v for j, v in dead}
            leased = None
            if chosen is not None:
                job, version = chosen
                leased = msgspec.structs.replace(
                    job, state="leased", attempts=job.attempts + 1, due_ms=now + lease_ms
                )
                puts.append(Put(PREFIX + job.id, _encode(leased)))
                expect[PREFIX + job.id] = version
            try:
                lsn = await self.store.transact(puts, expect=expect)
            except BaseException as exc:
                # Nothing was written (a conflict, a full disk): keep the entries; the stale
                # one is skipped next time and the job is re-indexed by the winner's commit.
                for entry in popped:
                    heapq.heappush(self._heap, entry)
                if isinstance(exc, VersionConflict):
                    continue
                raise
            if leased is not None:
                return leased, lsn

    async def ack(self, jid: str, token: int) -> Job:
        job = self._leased(jid, token)
        return await self._settle(job, token, self._put(job, "done", self.clock(), payload=b""))

    async def nack(self, jid: str, token: int, error: str = "") -> Job:
        """Give the job back: offered again after a backoff, or dead-lettered when out of attempts."""
        job, now = self._leased(jid, token), self.clock()
        if job.attempts >= self.max_attempts:
            return await self._settle(job, token, self._put(job, "dead", now, error=error))
        delay = self.backoff_ms * 2 ** (job.attempts - 1)
        return await self._settle(job, token, self._put(job, "ready", now + delay, error=error))

    async def purge(self, older_than_ms: int) -> int:
        """Delete done tombstones settled before ``older_than_ms`` (their keys are forgotten),
        at most 100 per transaction so no commit grows with the backlog."""
        self._check(write=True)
        doomed = [j.id for j in self._jobs.values() if j.state == "done" and j.due_ms < older_than_ms]
        for at in range(0, len(doomed), 100):
            batch = doomed[at : at + 100]
            await self.store.transact([Delete(PREFIX + jid) for jid in batch])
        return len(doomed)

    # -- helpers --------------------------------------------------------------------------------
    def _leased(self, jid: str, token: int) -> Job:
        self._check(write=True)
        job = self._jobs.get(jid)
        if job is None:
            raise NotFound(f"no job {jid}")
        if job.state != "leased" or self.store.latest_version(PREFIX + jid) != token:
            raise LeaseLost(f"job {jid} is no longer leased under this token")
        return job

    async def _settle(self, job: Job, token: int, put: Put) -> Job:
        try:
            await self.store.transact([put], expect={put.key: token})
        except VersionConflict:
            raise LeaseLost(f"job {job.id} changed while settling") from None
        return _decode(put.value)

    @staticmethod
    def _put(job: Job, state: State, due_ms: int, *, error: str = "", payload: bytes | None = None) -> Put:
        new = msgspec.structs.replace(
            job, state=state, due_ms=due_ms, error=error, payload=job.payload if payload is None else payload
        )
        return Put(PREFIX + job.id, _encode(new))

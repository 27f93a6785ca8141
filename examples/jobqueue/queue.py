"""A durable at-least-once job queue on afterword's record store (public API only).

The jobs are a ``Collection[Job]`` under ``job/``; a job's id is derived from the caller's
idempotency key, so enqueueing the same key twice finds the same record. Every change is one
``Collection.update`` (the job's lock held, one durable transaction). The lease token is the
version the lease committed, and an ack or nack expects it: a worker whose lease expired and
was taken over gets :class:`LeaseLost` instead of settling someone else's attempt. Acked jobs
stay as small tombstones (payload dropped) so a late duplicate is still recognised, until
:meth:`JobQueue.purge`.
"""

from __future__ import annotations

import hashlib
import heapq
import time
from collections.abc import Callable
from typing import Literal

import msgspec
from msgspec.structs import replace

from afterword.disk import Disk
from afterword.store import Collection, RecordStore, StoreOptions, VersionConflict

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


class QueueError(Exception):
    """A refused request; ``code`` names why (invalid_request, not_found, key_reused, too_large)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class LeaseLost(QueueError):  # the lease expired and was taken over, or the job was settled
    def __init__(self, message: str) -> None:
        super().__init__("lease_lost", message)


class QueueCorrupt(QueueError):  # a stored job does not decode: the queue refuses to run
    def __init__(self, message: str) -> None:
        super().__init__("state_corrupt", message)


def job_id(key: str) -> str:
    if not key or len(key) > 200:
        raise QueueError("invalid_request", "an idempotency key is 1-200 characters")
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class JobQueue:
    """Open with :meth:`open`; ``clock`` returns milliseconds (injected so tests can move time)."""

    def __init__(self, store: RecordStore, *, clock: Clock, max_attempts: int = 5, backoff_ms: int = 1000):
        self.store, self.clock = store, clock
        self.max_attempts, self.backoff_ms = max_attempts, backoff_ms
        self._heap: list[tuple[int, int, str]] = []  # (due, seq, id) of ready and leased jobs
        self._seq = 0
        # Replays the stored jobs through _index now (a bad record raises here), then follows
        # every durable commit; after a bad commit every use raises QueueCorrupt.
        self.jobs = Collection(
            store, PREFIX, Job, on_change=self._index, error=lambda _key, msg: QueueCorrupt(msg)
        )

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
        store = RecordStore.open(path, disk=disk, options=options)  # takes the ownership lock
        try:
            return cls(store, clock=clock or (lambda: int(time.time() * 1000)), **kw)
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        self.store.close()

    def _index(self, jid: str, old: Job | None, new: Job | None) -> None:
        if new is None:
            return
        if new.id != jid:
            raise QueueCorrupt(f"job record {jid!r} holds job {new.id!r}")
        self._seq = max(self._seq, new.seq)
        if new.state in ("ready", "leased"):  # a job's due only grows, so (id, due) is a version
            heapq.heappush(self._heap, (new.due_ms, new.seq, jid))

    def _writable(self) -> None:
        self.jobs.check()
        self.store.root.check_writable()  # after a failed fsync nothing is answered until reopened

    def get(self, jid: str) -> Job | None:
        return self.jobs.get(jid)

    def list_jobs(self, state: State | None = None, limit: int = 1000) -> list[Job]:
        jobs = [j for j in self.jobs.values() if state is None or j.state == state]
        return sorted(jobs, key=lambda j: j.seq)[:limit]

    async def enqueue(self, key: str, payload: bytes) -> tuple[Job, bool]:
        """Add a job once per idempotency key; returns ``(job, created)``."""
        self._writable()
        if len(payload) > MAX_PAYLOAD:
            raise QueueError("too_large", f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
        jid, digest = job_id(key), hashlib.sha256(payload).hexdigest()
        self._seq += 1
        job = Job(
            id=jid, key=key, digest=digest, payload=payload, state="ready", due_ms=self.clock(), seq=self._seq
        )

        def create(current: dict[str, Job | None]) -> dict[str, Job | None]:
            known = current[jid]
            if known is not None and known.digest != digest:
                raise QueueError("key_reused", f"key {key!r} was enqueued with another payload")
            return {} if known is not None else {jid: job}

        stored = (await self.jobs.update([jid], create))[jid]
        assert stored is not None
        return stored, stored is job

    async def lease(self, lease_ms: int) -> tuple[Job, int] | None:
        """The next due job (a ready one, or a leased one whose lease expired) with its lease
        token, or None. Jobs out of attempts met on the way are dead-lettered in the same
        transaction (at most 16, so the transaction stays small)."""
        while True:
            self._writable()
            now = self.clock()
            ids, popped = self._due(now)
            if not ids:
                return None
            try:
                got = await self._lease(ids, now, lease_ms)
            except BaseException:
                for entry in popped:  # nothing was written (a full disk, say): keep them due
                    heapq.heappush(self._heap, entry)
                raise
            if got is not None:
                return got

    def _due(self, now: int) -> tuple[list[str], list[tuple[int, int, str]]]:
        """Pop due jobs up to the first one with attempts left (without an await, so two
        workers never pick the same entry)."""
        ids: list[str] = []
        popped: list[tuple[int, int, str]] = []
        while self._heap and self._heap[0][0] <= now and len(ids) <= 16:
            entry = heapq.heappop(self._heap)
            job = self.jobs.get(entry[2])
            if job is None or job.state not in ("ready", "leased") or job.due_ms != entry[0]:
                continue  # a stale entry: the job changed since
            ids.append(job.id)
            popped.append(entry)
            if job.attempts < self.max_attempts:
                break
        return ids, popped

    async def _lease(self, ids: list[str], now: int, lease_ms: int) -> tuple[Job, int] | None:
        chosen: list[Job] = []

        def decide(current: dict[str, Job | None]) -> dict[str, Job | None]:
            out: dict[str, Job | None] = {}
            for jid in ids:  # re-checked under the locks: another worker may have been first
                job = current[jid]
                if job is None or job.state not in ("ready", "leased") or job.due_ms > now:
                    continue
                if job.attempts >= self.max_attempts:
                    out[jid] = replace(job, state="dead", due_ms=now, error=job.error or "lease expired")
                elif not chosen:
                    chosen.append(
                        replace(job, state="leased", attempts=job.attempts + 1, due_ms=now + lease_ms)
                    )
                    out[jid] = chosen[0]
            return out

        await self.jobs.update(ids, decide)
        if not chosen:
            return None
        # update returns right after its commit, with the job's lock just released and no
        # await since, so the job's version now is the one this lease committed.
        token = self.jobs.version(chosen[0].id)
        assert token is not None
        return chosen[0], token

    async def ack(self, jid: str, token: int) -> Job:
        return await self._settle(
            jid, token, lambda job, now: replace(job, state="done", due_ms=now, payload=b"", error="")
        )

    async def nack(self, jid: str, token: int, error: str = "") -> Job:
        """Give the job back: offered again after a backoff, or dead-lettered when out of attempts."""

        def back(job: Job, now: int) -> Job:
            if job.attempts >= self.max_attempts:
                return replace(job, state="dead", due_ms=now, error=error)
            return replace(
                job, state="ready", due_ms=now + self.backoff_ms * 2 ** (job.attempts - 1), error=error
            )

        return await self._settle(jid, token, back)

    async def _settle(self, jid: str, token: int, change: Callable[[Job, int], Job]) -> Job:
        self._writable()
        if self.jobs.get(jid) is None:
            raise QueueError("not_found", f"no job {jid}")

        def settle(current: dict[str, Job | None]) -> dict[str, Job | None]:
            job = current[jid]
            if job is None or job.state != "leased":
                raise LeaseLost(f"job {jid} is no longer leased")
            return {jid: change(job, self.clock())}

        try:  # the transaction expects the version the lease committed
            done = (await self.jobs.update([jid], settle, expect={jid: token}))[jid]
        except VersionConflict:
            raise LeaseLost(f"job {jid} was leased again under another token") from None
        assert done is not None
        return done

    async def purge(self, older_than_ms: int) -> int:
        """Delete done tombstones settled before ``older_than_ms`` (their keys are forgotten),
        at most 100 per transaction so no commit grows with the backlog."""
        self._writable()
        doomed = [j.id for j in self.jobs.values() if j.state == "done" and j.due_ms < older_than_ms]
        for at in range(0, len(doomed), 100):
            await self.jobs.update(doomed[at : at + 100], lambda cur: {i: None for i, j in cur.items() if j})
        return len(doomed)

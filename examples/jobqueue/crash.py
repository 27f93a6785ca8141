"""The job queue's crash workload, registered from outside afterword:

    python -m tools.crashsim run --workload examples.jobqueue.crash:JobQueueWorkload

A seeded script of enqueues (some repeating a key), leases, acks, nacks and stale acks, with
a fake clock that sometimes jumps past every lease deadline. ``expect`` is an independent
model of the queue's rules (it does not call the queue). Besides the runner's prefix checks,
the workload declares two facts (an acknowledged enqueue is present; an acked job stays done)
and its probe leases everything after recovery with the clock far ahead: every job that was
ready or leased must be offered (an expired lease comes back), no done job may be.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import anyio
import msgspec

from afterword.disk import Disk
from afterword.store import StoreOptions, open_readonly
from afterword.wal import WalOptions
from afterword.wal.testing import inline_by_batch_only
from tools.crashsim import Journal, Workload

from .queue import PREFIX, Job, JobQueue, QueueError

MAX_ATTEMPTS, LEASE_MS, BACKOFF_MS = 2, 10_000, 1_000
# Small unfilled segments and a small log cap: segments turn over and checkpoints run within a
# short script. The commit mode is the shipped default; one checkpoint thread and the log's
# test hook (``run``) keep the recorded disk log the same on every run.
OPTIONS = StoreOptions(
    wal=WalOptions(segment_size=2304, max_payload=1024, max_log_bytes=4608, zero_fill=False),
    checkpoint_threads=1,
)


# Every promise is exercised within the first 17 operations, whatever the seed (which picks
# payloads, small clock steps and what follows): (kind, lease op it refers to, clock jumps
# past every lease first).
SKELETON = [
    ("enqueue", 0, False),
    ("enqueue", 0, False),
    ("lease", 0, False),
    ("repeat", 0, False),  # the same key again: the same job
    ("lease", 0, False),
    ("ack", 3, False),
    ("lease", 0, True),  # op 5's lease expired: that job is offered again (attempt 2)
    ("ack", 5, False),  # with the expired token: lease lost, nothing changes
    ("enqueue", 0, False),
    ("nack", 7, False),  # out of attempts: dead-lettered
    ("lease", 0, False),
    ("lease", 0, True),  # op 11's job again, its last attempt
    ("enqueue", 0, False),
    ("lease", 0, True),  # op 13's job: it was due before op 12's lease ran out
    ("nack", 14, False),  # back to ready after a backoff
    ("lease", 0, True),  # op 12's job, out of attempts, dead-lettered in the same commit
    ("ack", 16, False),  # done after a nack: the last error goes with the payload
]


@dataclass(frozen=True)
class Op:
    kind: str  # enqueue | lease | ack | nack
    at: int  # the clock (ms) while the operation runs
    key: str = ""
    payload: bytes = b""
    lease_op: int = 0  # ack/nack: the lease operation whose token is used


@dataclass(frozen=True)
class MJob:
    """The model's view of one job; ``leased_by`` is the lease op that holds it."""

    state: str
    attempts: int
    due: int
    seq: int
    payload: bytes
    error: str = ""
    leased_by: int = 0


def jid(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def apply(jobs: dict[str, MJob], n: int, op: Op) -> None:
    """The queue's rules, written from its documentation rather than from its code."""
    if op.kind == "enqueue":
        jobs.setdefault(jid(op.key), MJob("ready", 0, op.at, len(jobs) + 1, op.payload))
    elif op.kind == "lease":
        due = sorted((j.due, j.seq, i) for i, j in jobs.items() if j.state in ("ready", "leased"))
        dead = 0
        for when, _, i in due:
            if when > op.at or dead == 16:
                break
            j = jobs[i]
            if j.attempts >= MAX_ATTEMPTS:
                jobs[i], dead = (
                    replace(j, state="dead", due=op.at, error=j.error or "lease expired"),
                    dead + 1,
                )
                continue
            jobs[i] = replace(j, state="leased", attempts=j.attempts + 1, due=op.at + LEASE_MS, leased_by=n)
            break
    else:
        held = [i for i, j in jobs.items() if j.state == "leased" and j.leased_by == op.lease_op]
        for i in held:
            j = jobs[i]
            if op.kind == "ack":
                jobs[i] = replace(j, state="done", due=op.at, payload=b"", error="", leased_by=0)
            elif j.attempts >= MAX_ATTEMPTS:
                jobs[i] = replace(j, state="dead", due=op.at, error="nack", leased_by=0)
            else:
                delay = BACKOFF_MS * 2 ** (j.attempts - 1)
                jobs[i] = replace(j, state="ready", due=op.at + delay, error="nack", leased_by=0)


def observe(jobs: Mapping[str, MJob]) -> dict[str, tuple[str, int, int, bytes, str]]:
    return {i: (j.state, j.attempts, j.due, j.payload, j.error) for i, j in jobs.items()}


class JobQueueWorkload(Workload):
    name = "jobqueue"
    summary = "examples/jobqueue: enqueue, lease, ack, nack, expired leases, dead letters"
    default_ops = 17

    def __init__(self, *, seed: int, ops: int | None = None) -> None:
        super().__init__(seed=seed, ops=ops)
        rng, jobs, at = random.Random(f"jobqueue/{seed}"), dict[str, MJob](), 1000
        self.script: list[Op] = []
        for n in range(1, self.ops + 1):
            if n <= len(SKELETON):
                kind, ref, jump = SKELETON[n - 1]
                at += LEASE_MS + 1 if jump else rng.choice([0, 10, 500])
            else:  # past the skeleton: random steps, often jumping past every lease
                at += rng.choice([0, 10, 1500, LEASE_MS + 1, LEASE_MS + 1])
                held = [j.leased_by for j in jobs.values() if j.state == "leased"]
                kinds = ["enqueue"] * (4 if len(jobs) < 4 else 1) + ["lease"] * 4 + ["repeat"]
                kinds += ["ack"] * 2 * bool(held) + ["nack"] * bool(held) + ["stale"]
                kind, ref = rng.choice(kinds), rng.choice(held or [0])
                if kind == "stale":
                    kind, ref = (
                        "ack",
                        rng.choice([m for m, o in enumerate(self.script, 1) if o.kind == "lease"]),
                    )
            if kind == "enqueue":
                op = Op("enqueue", at, key=f"k{n}", payload=rng.randbytes(rng.randint(4, 24)))
            elif kind == "repeat":
                op = replace(rng.choice([o for o in self.script if o.kind == "enqueue"]), at=at)
            else:
                op = Op(kind, at, lease_op=ref)
            apply(jobs, n, op)
            self.script.append(op)

    def run(self, state_dir: str, disk: Disk, journal: Journal) -> None:
        with inline_by_batch_only():  # the inline-or-writer choice from the batch, not the clock
            anyio.run(self._run, state_dir, disk, journal)

    async def _run(self, state_dir: str, disk: Disk, journal: Journal) -> None:
        clock = [0]
        queue = journal.side("open", lambda: self._open(state_dir, disk, clock))
        if queue is None:  # only under injected faults: nothing can be attempted
            for n in range(1, self.ops + 1):
                journal.fail(n, None, refused=True)
            return
        tokens: dict[int, tuple[str, int]] = {}
        for n, op in enumerate(self.script, 1):
            clock[0] = op.at

            async def step(n: int = n, op: Op = op) -> None:
                if op.kind == "enqueue":
                    await queue.enqueue(op.key, op.payload)
                elif op.kind == "lease":
                    got = await queue.lease(LEASE_MS)
                    if got is not None:
                        tokens[n] = (got[0].id, got[1])
                else:
                    held = tokens.get(op.lease_op, ("0" * 32, -1))
                    try:
                        if op.kind == "ack":
                            await queue.ack(*held)
                        else:
                            await queue.nack(*held, "nack")
                    except QueueError as exc:  # a definite refusal: it took effect as nothing
                        if exc.code not in ("lease_lost", "not_found"):
                            raise

            if op.kind in ("ack", "nack") and journal.outcomes.get(op.lease_op) not in (None, "acked"):
                # The lease failed (outcome unknown, or refused): the client holds no token and
                # never sends this, whether or not the lease landed.
                journal.begin(n)
                journal.fail(n, None, refused=True)
                continue
            await journal.attempt_async(n, step, poisoned=lambda: queue.store.root.failed is not None)
            if journal.outcomes.get(n) == "acked" and op.kind == "enqueue":
                journal.fact(f"enqueued/{jid(op.key)}", "present")
            got = queue.get(tokens.get(op.lease_op, ("",))[0]) if op.kind == "ack" else None
            if journal.outcomes.get(n) == "acked" and got is not None and got.state == "done":
                journal.fact(f"acked/{got.id}", "done")
        queue.close()

    @staticmethod
    def _open(state_dir: str, disk: Disk | None, clock: list[int]) -> JobQueue:
        return JobQueue.open(
            state_dir,
            disk=disk,
            options=OPTIONS,
            clock=lambda: clock[0],
            max_attempts=MAX_ATTEMPTS,
            backoff_ms=BACKOFF_MS,
        )

    def expect(self, committed: Sequence[int]) -> dict[str, tuple[str, int, int, bytes, str]]:
        jobs: dict[str, MJob] = {}
        for n in committed:
            apply(jobs, n, self.script[n - 1])
        return observe(jobs)

    def recover(self, state_dir: str, disk: Disk) -> dict[str, tuple[str, int, int, bytes, str]]:
        queue = self._open(state_dir, disk, [0])
        try:
            return {
                j.id: (j.state, j.attempts, j.due_ms, j.payload, j.error)
                for j in queue.list_jobs(limit=10**6)
            }
        finally:
            queue.close()

    def facts(self, state_dir: str) -> dict[str, str]:
        out: dict[str, str] = {}
        with open_readonly(state_dir, options=OPTIONS) as view:
            for rec in view.items(PREFIX):
                job = msgspec.msgpack.decode(rec.value, type=Job)
                out[f"enqueued/{job.id}"] = "present"
                out[f"acked/{job.id}"] = job.state
        return out

    def probe(self, state_dir: str, observation: Mapping[str, object]) -> list[str]:
        return anyio.run(self._probe, state_dir, observation)

    async def _probe(self, state_dir: str, seen: Mapping[str, object]) -> list[str]:
        """After recovery, with the clock past every deadline: lease until nothing is due,
        ack everything, reopen, purge, reopen. Names every broken promise it sees."""
        problems: list[str] = []
        view = {i: v for i, v in seen.items() if isinstance(v, tuple)}
        live = {i for i, v in view.items() if v[0] in ("ready", "leased")}
        offerable = {i for i in live if view[i][1] < MAX_ATTEMPTS}
        later = [10**12]
        queue = self._open(state_dir, None, later)
        try:
            offered: list[tuple[str, int]] = []
            while (got := await queue.lease(LEASE_MS)) is not None:
                offered.append((got[0].id, got[1]))
            ids = [i for i, _ in offered]
            if sorted(ids) != sorted(offerable):
                problems.append(f"offered {sorted(ids)} after recovery, expected {sorted(offerable)}")
            for i in set(ids) - live:
                problems.append(f"job {i} was {view.get(i, ('absent',))[0]} and was offered again")
            for i, token in offered:
                await queue.ack(i, token)
            await queue.enqueue("probe", b"after recovery")
        finally:
            queue.close()
        queue = self._open(state_dir, None, later)
        try:
            for i, v in view.items():
                job = queue.get(i)
                want = "done" if i in offerable else ("dead" if i in live else v[0])
                if job is None or job.state != want:
                    problems.append(
                        f"after the probe's reopen job {i} is {job and job.state}, expected {want}"
                    )
            await queue.purge(later[0] + 1)
        finally:
            queue.close()
        queue = self._open(state_dir, None, later)
        try:
            if queue.list_jobs("done") or len(queue.list_jobs()) != len(view) + 1 - len(offerable) - sum(
                1 for v in view.values() if v[0] == "done"
            ):
                problems.append("purge removed something other than the done tombstones")
        finally:
            queue.close()
        return problems

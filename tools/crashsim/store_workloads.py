"""The built-in workloads: the record store, its checkpoints and the blob store.

Each is a script of steps over numbered transactions generated from the seed; op *i* is the
*i*-th transaction and commits as lsn *i* on a fresh store (checked while recording).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import hashlib
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import anyio

from afterword.blobs import BlobError, BlobStore, blob_digest
from afterword.disk import Disk, OsDisk, StateRoot, is_temp_name
from afterword.store import Delete, Put, RecordStore, StoreError, StoreOptions
from afterword.store.codec import decode_record
from afterword.wal.testing import inline_by_batch_only

from .workloads import Journal, Observation, Workload, WorkloadError, register


@dataclass(frozen=True)
class Txn:
    puts: tuple[tuple[str, bytes, tuple[str, ...]], ...] = ()
    deletes: tuple[str, ...] = ()

    def mutations(self) -> list[Put | Delete]:
        out: list[Put | Delete] = [Put(k, v, b) for k, v, b in self.puts]
        out.extend(Delete(k) for k in self.deletes)
        return out


@dataclass(frozen=True)
class Commit:
    """Commit operations ``ops``: one after another, or all at once (group commit)."""

    ops: tuple[int, ...]
    concurrent: bool = False


@dataclass(frozen=True)
class Checkpoint:
    pass


@dataclass(frozen=True)
class Reopen:
    """Close the store cleanly and open it again (recovery of a clean shutdown)."""


@dataclass(frozen=True)
class PutBlob:
    data: bytes


@dataclass(frozen=True)
class Sweep:
    pass


Step = Commit | Checkpoint | Reopen | PutBlob | Sweep
RecordView = tuple[int, bytes, tuple[str, ...]]


def small_options(segment_size: int, max_payload: int, max_log_bytes: int) -> StoreOptions:
    """The shipped defaults (commit mode included), with tiny unfilled segments: logs stay
    small and segment turnover is frequent.

    One checkpoint thread keeps the order of record-file writes, and so the log, the same on
    every run (with several threads the log is still valid, only not reproducible)."""
    shipped = StoreOptions()
    wal = replace(
        shipped.wal,
        segment_size=segment_size,
        max_payload=max_payload,
        max_log_bytes=max_log_bytes,
        zero_fill=False,
    )
    return replace(shipped, wal=wal, checkpoint_threads=1)


@contextlib.contextmanager
def repeatable_commits() -> Iterator[None]:
    """Run the store as shipped, except that the one clock-driven choice of the commit path
    (whether a lone commit is written inline) is pinned, so a recording, and with it
    every state id, is the same on every run. Through the log's exported test hook."""
    with inline_by_batch_only():
        yield


class StoreWorkload(Workload):
    """Base of the record-store workloads: a script of steps over numbered transactions."""

    options: StoreOptions = small_options(704, 256, 1 << 20)
    blob_quota: ClassVar[int | None] = None  # open a BlobStore beside the records

    def __init__(self, *, seed: int, ops: int | None = None) -> None:
        super().__init__(seed=seed, ops=ops)
        self.rng = random.Random(f"{self.name}/{seed}")
        self.txns: list[Txn] = []
        self.steps: list[Step] = []
        self.script()
        if len(self.txns) != self.ops:
            raise WorkloadError(f"{self.name}: script made {len(self.txns)} transactions, not {self.ops}")
        self._legal: dict[tuple[int, ...], set[tuple[str, RecordView]]] = {}

    @abc.abstractmethod
    def script(self) -> None:
        """Fill ``self.txns`` (transaction i+1 at index i) and ``self.steps``."""

    # helpers for scripts
    def random_txn(self, keys: Sequence[str], live: dict[str, bytes], max_keys: int = 3) -> Txn:
        chosen = self.rng.sample(list(keys), self.rng.randint(1, min(max_keys, len(keys))))
        puts: list[tuple[str, bytes, tuple[str, ...]]] = []
        deletes: list[str] = []
        for key in chosen:
            if key in live and self.rng.random() < 0.3:
                deletes.append(key)
                del live[key]
            else:
                value = self.rng.randbytes(self.rng.randint(4, 40))
                puts.append((key, value, ()))
                live[key] = value
        return Txn(tuple(puts), tuple(deletes))

    # Workload interface
    def run(self, state_dir: str, disk: Disk, journal: Journal) -> None:
        with repeatable_commits():
            _StoreSession(self, state_dir, disk, journal).run()

    def expect(self, committed: Sequence[int]) -> dict[str, RecordView]:
        state: dict[str, RecordView] = {}
        for lsn, op in enumerate(committed, 1):
            txn = self.txns[op - 1]
            for key, value, blobs in txn.puts:
                state[key] = (lsn, value, blobs)
            for key in txn.deletes:
                state.pop(key, None)
        return state

    def recover(self, state_dir: str, disk: Disk) -> dict[str, RecordView]:
        store = RecordStore.open(state_dir, disk=disk, options=self.options)
        try:
            seen = {r.key: (r.lsn, r.value, tuple(r.blobs)) for r in store.items()}
            if self.blob_quota is not None:
                BlobStore(store.root, store.secret, quota=self.blob_quota)  # as a real opener would
        finally:
            store.close()
        return seen

    def _legal_images(self, history: Sequence[int]) -> set[tuple[str, RecordView]]:
        key = tuple(history)
        found = self._legal.get(key)
        if found is None:
            found = set()
            for j in range(len(key) + 1):
                found.update(self.expect(key[:j]).items())
            self._legal[key] = found
        return found

    def file_problems(self, files: Mapping[str, bytes], histories: Sequence[Sequence[int]]) -> list[str]:
        """Every record file is some committed version of its record: old or new, never torn."""
        legal: set[tuple[str, RecordView]] = set()
        for h in histories:
            legal |= self._legal_images(h)
        problems: list[str] = []
        for path, data in sorted(files.items()):
            head, _, name = path.rpartition("/")
            if head != "records" or is_temp_name(name):
                continue
            try:
                image = decode_record(data, name)
            except StoreError as exc:
                problems.append(f"record file {name} is torn or foreign: {exc}")
                continue
            view = (image.key, (image.lsn, image.value, tuple(image.blobs)))
            if view not in legal:
                problems.append(f"record file {name} holds {image.key!r}@{image.lsn}, no committed version")
        return problems

    def facts(self, state_dir: str) -> dict[str, str]:
        """The token secret must survive every crash once an open has returned."""
        root = StateRoot(state_dir, create=False)
        return {"secret": _secret_fingerprint(root.read_file("secret", max_size=32))}

    def state_problems(self, state_dir: str, observation: Observation) -> list[str]:
        """Every blob a record references exists and matches its digest."""
        wanted = _referenced(observation)
        if not wanted:
            return []
        root = StateRoot(state_dir, create=False)
        secret = root.read_file("secret", max_size=32)
        blobs = BlobStore(root, secret, quota=self.blob_quota or (1 << 28))
        problems = []
        for digest, key in sorted(wanted.items()):
            try:
                blobs.get(digest)
            except BlobError as exc:
                problems.append(f"blob {digest[:12]} referenced by {key!r}: {type(exc).__name__}: {exc}")
        return problems

    def probe(self, state_dir: str, observation: Observation) -> list[str]:
        """Keep writing after recovery, in the session that recovered: enough commits to
        start new segments, a reopen, a checkpoint, another reopen. The recovered records
        must survive all of it."""
        options = replace(self.options, auto_checkpoint=False)
        count = 2 * (self.options.wal.segment_size // 48) + 2
        probes = {f"probe:{i}": f"p{i}".encode() for i in range(count)}
        problems: list[str] = []
        try:
            with RecordStore.open(state_dir, options=options) as store:
                now = {r.key: (r.lsn, r.value, tuple(r.blobs)) for r in store.items()}
                if now != observation:
                    problems.append("recovering an identical copy exposed different records")
                for key, value in probes.items():
                    store.transact_sync([Put(key, value)])
                if self.blob_quota is not None:
                    blobs = BlobStore(store.root, store.secret, quota=self.blob_quota)
                    blobs.sweep(store.referenced_blobs())
            problems += _compare_after_probe("commits after recovery", observation, probes, state_dir, self)
            with RecordStore.open(state_dir, options=options) as store:
                store.checkpoint_sync()
                store.transact_sync([Put("probe:last", b"last")])
            probes["probe:last"] = b"last"
            problems += _compare_after_probe(
                "checkpoint after recovery", observation, probes, state_dir, self
            )
        except Exception as exc:
            problems.append(f"using the recovered store failed: {type(exc).__name__}: {exc}")
        if not problems:
            problems += self.state_problems(state_dir, observation)
        return problems


def _secret_fingerprint(secret: bytes) -> str:
    """Enough of a digest to tell secrets apart; the secret itself is never logged."""
    return hashlib.sha256(b"crashsim-fingerprint\x00" + secret).hexdigest()[:16]


def _referenced(observation: Observation) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, view in observation.items():
        assert isinstance(view, tuple)
        for digest in view[2]:
            out.setdefault(digest, key)
    return out


def _compare_after_probe(
    stage: str, before: Observation, probes: Mapping[str, bytes], state_dir: str, workload: StoreWorkload
) -> list[str]:
    after = workload.recover(state_dir, OsDisk())
    problems = []
    for key, view in before.items():
        if after.get(key) != view:
            problems.append(
                f"{stage}: record {key!r} changed from {_short(view)} to {_short(after.get(key))}"
            )
    for key, value in probes.items():
        got = after.get(key)
        if not isinstance(got, tuple) or got[1] != value:
            problems.append(f"{stage}: acknowledged probe {key!r} lost")
    extra = set(after) - set(before) - set(probes)
    if extra:
        problems.append(f"{stage}: unexpected records {sorted(extra)}")
    return problems


def _short(view: object) -> str:
    if view is None:
        return "absent"
    if isinstance(view, tuple) and len(view) == 3:
        lsn, value, blobs = view
        return f"lsn {lsn} value {bytes(value)[:8].hex()}" + (f" blobs {len(blobs)}" if blobs else "")
    return repr(view)[:60]


class _StoreSession:
    """One execution of a store workload's script."""

    def __init__(self, workload: StoreWorkload, state_dir: str, disk: Disk, journal: Journal) -> None:
        self.w = workload
        self.state_dir = state_dir
        self.disk = disk
        self.journal = journal
        self.store: RecordStore | None = None
        self.blobs: BlobStore | None = None

    def poisoned(self) -> bool:
        return self.store is None or self.store.root.failed is not None

    def open(self) -> None:
        self.store = RecordStore.open(self.state_dir, disk=self.disk, options=self.w.options)
        self.journal.note("opened")
        self.journal.fact("secret", _secret_fingerprint(self.store.secret))
        if self.w.blob_quota is not None:
            self.blobs = BlobStore(self.store.root, self.store.secret, quota=self.w.blob_quota)

    def run(self) -> None:
        self.journal.side("open", self.open)
        try:
            for step in self.w.steps:
                self.step(step)
        finally:
            if self.store is not None:
                self.store.close()

    def step(self, step: Step) -> None:
        journal = self.journal
        if isinstance(step, Commit):
            if self.store is None:
                for op in step.ops:
                    journal.fail(op, None, refused=True)
            elif step.concurrent:
                anyio.run(self.group, step.ops)
            else:
                for op in step.ops:
                    if self.missing_blobs(op):
                        journal.fail(op, None, refused=True)  # a caller never commits a dangling reference
                        continue
                    journal.attempt(op, functools.partial(self.commit_sync, op), poisoned=self.poisoned)
        elif self.store is None:
            return
        elif isinstance(step, Checkpoint):
            journal.side("checkpoint", self.store.checkpoint_sync)
        elif isinstance(step, Reopen):
            self.store.close()
            self.store = None
            self.blobs = None
            journal.side("reopen", self.open)
        elif isinstance(step, PutBlob):
            if self.blobs is not None:
                journal.side("blob put", functools.partial(self.blobs.put, step.data))
        elif isinstance(step, Sweep):
            store, blobs = self.store, self.blobs
            if blobs is not None:
                journal.side("sweep", lambda: blobs.sweep(store.referenced_blobs()))

    def missing_blobs(self, op: int) -> bool:
        """The operation references a blob whose put failed (only under injected faults)."""
        digests = [d for _, _, ds in self.w.txns[op - 1].puts for d in ds]
        return bool(digests) and (self.blobs is None or any(d not in self.blobs for d in digests))

    def commit_sync(self, op: int) -> int:
        """A lone commit through the event-loop path the service uses (``transact``, and so
        the configured commit mode: a lone ``adaptive`` commit is written inline), not the
        synchronous path of tools and migrations."""
        store = self.store
        assert store is not None
        lsn = anyio.run(functools.partial(store.transact, self.w.txns[op - 1].mutations()))
        self.after_commit(op, lsn)
        return lsn

    async def group(self, ops: Sequence[int]) -> None:
        store = self.store
        assert store is not None

        async def one(op: int) -> None:
            if self.missing_blobs(op):
                self.journal.fail(op, None, refused=True)
                return

            async def commit() -> int:
                lsn = await store.transact(self.w.txns[op - 1].mutations())
                self.after_commit(op, lsn)
                return lsn

            await self.journal.attempt_async(op, commit, poisoned=self.poisoned)

        async with anyio.create_task_group() as tg:
            for op in ops:
                tg.start_soon(one, op)

    def after_commit(self, op: int, lsn: int) -> None:
        if not self.journal.tolerant and lsn != op:
            raise WorkloadError(f"{self.w.name}: operation {op} committed as lsn {lsn} (not deterministic)")
        if self.blobs is not None:
            for _, _, digests in self.w.txns[op - 1].puts:
                for digest in digests:
                    self.blobs.unpin(digest)


# -- the built-in workloads -------------------------------------------------------------------
@register
class StoreTransactions(StoreWorkload):
    """Single and multi-key puts and deletes, a burst of concurrent commits, a clean reopen."""

    name = "store-tx"
    summary = "record-store transactions: sync commits, a group commit, a clean reopen"
    default_ops = 8
    options = small_options(704, 256, 1 << 20)

    def script(self) -> None:
        keys, live = ["a", "b", "c", "d"], dict[str, bytes]()
        self.txns = [self.random_txn(keys, live) for _ in range(self.ops)]
        n = self.ops
        group = min(4, n // 2) if n >= 4 else 0
        first = (n - group + 1) // 2
        ops = list(range(1, n + 1))
        self.steps = [Commit(tuple(ops[:first]))]
        if group:
            self.steps.append(Commit(tuple(ops[first : first + group]), concurrent=True))
        rest = ops[first + group :]
        if rest:
            # One commit in the session of the group, so whatever a failed group write leaves
            # behind is written over before the reopen.
            self.steps.append(Commit(tuple(rest[:1])))
            if len(rest) > 1:
                if n >= 6:
                    self.steps.append(Reopen())
                self.steps.append(Commit(tuple(rest[1:])))


@register
class CheckpointRecycling(StoreWorkload):
    """Commits over tiny segments so checkpoints (explicit and automatic) recycle them."""

    name = "checkpoint"
    summary = "checkpoints with segment recycling: 704-byte segments, 1 KiB log cap, group commits"
    default_ops = 16
    options = small_options(704, 256, 1024)

    def script(self) -> None:
        keys, live = ["k1", "k2", "k3", "k4", "k5"], dict[str, bytes]()
        self.txns = [self.random_txn(keys, live) for _ in range(self.ops)]
        ops = list(range(1, self.ops + 1))
        pattern = (("sync", 2), ("group", 3), ("sync", 1), ("checkpoint", 0))
        i = 0
        while i < len(ops):
            for kind, count in pattern:
                chunk = tuple(ops[i : i + count])
                if kind == "checkpoint":
                    self.steps.append(Checkpoint())
                elif chunk:
                    self.steps.append(Commit(chunk, concurrent=kind == "group" and len(chunk) > 1))
                    i += len(chunk)


@register
class BlobLifecycle(StoreWorkload):
    """Blobs put, referenced by records, dereferenced, swept, and put again."""

    name = "blobs"
    summary = "blob put + reference + sweep: records referencing content-addressed blobs"
    default_ops = 6
    options = small_options(1280, 512, 1 << 20)
    blob_quota = 1 << 20

    def script(self) -> None:
        contents = [self.rng.randbytes(self.rng.randint(100, 1500)) for _ in range(max(2, self.ops // 2))]
        digests = [blob_digest(c) for c in contents]
        holders: dict[str, str] = {}  # key -> digest it references
        for op in range(1, self.ops + 1):
            phase = op % 3
            if phase == 1 or not holders:
                pick = self.rng.randrange(len(contents))
                key = f"doc{op}"
                self.steps.append(PutBlob(contents[pick]))
                self.txns.append(Txn(puts=((key, f"uses {pick}".encode(), (digests[pick],)),)))
                holders[key] = digests[pick]
                self.steps.append(Commit((op,)))
            elif phase == 2:
                key = self.rng.choice(sorted(holders))
                del holders[key]
                self.txns.append(Txn(deletes=(key,)))
                self.steps.append(Commit((op,)))
                self.steps.append(Sweep())
            else:
                key = self.rng.choice(sorted(holders))
                pick = self.rng.randrange(len(contents))
                self.steps.append(PutBlob(contents[pick]))
                self.txns.append(Txn(puts=((key, f"now {pick}".encode(), (digests[pick],)),)))
                holders[key] = digests[pick]
                self.steps.append(Commit((op,)))
                self.steps.append(Checkpoint())
        self.steps.append(Sweep())

"""Crash states: which operations a crash at each point may keep, and the trees they leave.

A *crash point* ``p`` means the first ``p`` disk operations of the log were issued. An issued
operation is *covered* at ``p`` when a barrier issued before ``p`` covers it (a later
fsync/fdatasync of the same file for data, a later fsync of the entry's directory for names);
covered operations persist. Every other issued operation has the fates its persistence model
allows (``model.py``). A :class:`CrashState` names one point and one fate per uncovered
operation; its id (``ident``) is stable, so a state found by sampling can be rebuilt exactly
from ``(workload, seed, model, ident)``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from afterword.disk import Disk, OsDisk

from .model import DROP, GARBAGE, KEEP, NEW, OLD, SECTOR, ZERO, Model, pieces, product
from .recorder import (
    Create,
    DiskOp,
    Fallocate,
    Mark,
    Mkdir,
    Recording,
    Rename,
    Rmdir,
    Sync,
    SyncDir,
    Truncate,
    Unlink,
    Write,
)

NEVER = 1 << 62


@dataclass(frozen=True)
class CrashState:
    point: int
    choice: tuple[tuple[int, int], ...] = ()  # (op index, outcome) for every outcome != KEEP

    @property
    def ident(self) -> str:
        fates = ",".join(f"{i}={o}" for i, o in self.choice)
        return f"{self.point}" + (f"/{fates}" if fates else "")

    @classmethod
    def parse(cls, ident: str) -> CrashState:
        try:
            point, _, rest = ident.partition("/")
            choice: list[tuple[int, int]] = []
            if rest:
                for part in rest.split(","):
                    i, _, o = part.partition("=")
                    choice.append((int(i), int(o)))
            return cls(int(point), tuple(sorted(choice)))
        except ValueError:  # int()'s own message names neither the id nor its form
            raise ValueError(
                f"bad crash state id {ident!r}; expected N or N/I=O,... as a report printed"
            ) from None


@dataclass(frozen=True)
class Tree:
    """The files and directories a crash state leaves, relative to the recording's base."""

    dirs: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...]

    @cached_property
    def digest(self) -> str:
        h = hashlib.sha256()
        for d in self.dirs:
            h.update(b"D" + d.encode() + b"\x00")
        for path, data in self.files:
            h.update(b"F" + path.encode() + b"\x00" + len(data).to_bytes(8, "little") + data)
        return h.hexdigest()

    def under(self, prefix: str) -> dict[str, bytes]:
        """Files below directory ``prefix``, keyed by their path relative to it."""
        lead = prefix.rstrip("/") + "/"
        return {path[len(lead) :]: data for path, data in self.files if path.startswith(lead)}

    def materialize(self, base: str, disk: Disk | None = None) -> None:
        """Write the tree into the empty directory ``base``: directories 0700, files 0600."""
        disk = disk or OsDisk()
        for d in self.dirs:
            disk.mkdir(os.path.join(base, d), 0o700)
        for path, data in self.files:
            fd = disk.open(
                os.path.join(base, path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
            )
            try:
                if data:
                    disk.pwrite(fd, data, 0)
            finally:
                disk.close(fd)


@dataclass
class _Fs:
    """The name space and file contents while operations are applied."""

    dirs: set[str]
    entries: dict[tuple[str, str], int]
    data: dict[int, bytearray] = field(default_factory=dict)

    def buf(self, ino: int) -> bytearray:
        return self.data.setdefault(ino, bytearray())


def _join(d: str, name: str) -> str:
    return f"{d}/{name}" if d else name


class StateSpace:
    """All crash states of one recording under one persistence model."""

    def __init__(self, recording: Recording, model: Model) -> None:
        self.recording = recording
        self.model = model
        self.ops: list[DiskOp] = recording.disk_ops()
        self.n = len(self.ops)
        self._cover = self._covering_barriers()
        self._unsynced = self._unsynced_lists()
        self._bounds = self._ack_bounds()
        self._facts = self._facts_by_point()

    # -- coverage ----------------------------------------------------------------------------
    def _covering_barriers(self) -> list[int]:
        """For each op, the index of the first later barrier covering it (NEVER if none)."""
        cover = [NEVER] * self.n
        next_file: dict[int, int] = {}
        next_dir: dict[str, int] = {}
        for i in range(self.n - 1, -1, -1):
            op = self.ops[i]
            if isinstance(op, Sync):
                next_file[op.ino] = i
                cover[i] = i
            elif isinstance(op, SyncDir):
                next_dir[op.dir] = i
                cover[i] = i
            elif isinstance(op, Write | Truncate | Fallocate):
                cover[i] = next_file.get(op.ino, NEVER)
            elif isinstance(op, Rename):
                cover[i] = max(next_dir.get(op.src_dir, NEVER), next_dir.get(op.dst_dir, NEVER))
            else:
                cover[i] = next_dir.get(op.dir, NEVER)
        return cover

    def _unsynced_lists(self) -> list[tuple[int, ...]]:
        covered_at: dict[int, list[int]] = {}
        for i, c in enumerate(self._cover):
            if c != i and c != NEVER:
                covered_at.setdefault(c, []).append(i)
        out: list[tuple[int, ...]] = [()]
        current: list[int] = []
        for p in range(self.n):
            op = self.ops[p]
            if not isinstance(op, Sync | SyncDir):
                current.append(p)
            done = covered_at.get(p)
            if done:
                gone = set(done)
                current = [i for i in current if i not in gone]
            out.append(tuple(current))
        return out

    def unsynced(self, point: int) -> tuple[int, ...]:
        """Indices of the issued operations no barrier before ``point`` covers."""
        return self._unsynced[point]

    # -- acknowledgement bounds --------------------------------------------------------------
    def _facts_by_point(self) -> list[dict[str, str]]:
        """Per crash point, the facts the workload had declared durable by the end of the
        crash window (a ``fact`` mark's note is ``name=value``)."""
        facts: dict[str, str] = {}
        out: list[dict[str, str]] = []
        for entry in self.recording.entries:
            if isinstance(entry, Mark):
                if entry.kind == "fact":
                    name, _, value = entry.note.partition("=")
                    facts = {**facts, name: value}
                continue
            out.append(facts)
        out.append(facts)
        return out

    def facts(self, point: int) -> dict[str, str]:
        return self._facts[point]

    def _ack_bounds(self) -> list[tuple[int, int]]:
        """Per crash point ``(lo, hi)``: ops ``1..lo`` were acknowledged before the crash, and
        no op after ``hi`` had begun. A crash at point p happens anywhere between disk op p-1
        and disk op p, so ``lo`` counts acknowledgements up to the end of that window and
        ``hi`` counts beginnings up to its start (the strictest reading of both)."""
        acked = begun = 0
        at_start: list[int] = [0]
        bounds: list[tuple[int, int]] = []
        for entry in self.recording.entries:
            if isinstance(entry, Mark):
                if entry.kind == "ack":
                    acked = max(acked, entry.op)
                elif entry.kind == "begin":
                    begun = max(begun, entry.op)
                continue
            bounds.append((acked, max(at_start[-1], acked)))
            at_start.append(begun)
        bounds.append((acked, max(at_start[-1], acked)))
        return bounds

    def bounds(self, point: int) -> tuple[int, int]:
        return self._bounds[point]

    # -- the space ---------------------------------------------------------------------------
    def outcome_counts(self, point: int) -> list[int]:
        return [self.model.outcomes(self.ops[i]) for i in self.unsynced(point)]

    def size(self, point: int, cap: int) -> int:
        return product(self.outcome_counts(point), cap)

    def total(self, cap: int) -> int:
        """States in the whole space, saturating at ``cap + 1``."""
        total = 0
        for p in range(self.n + 1):
            total += self.size(p, cap)
            if total > cap:
                return cap + 1
        return total

    def enumerate(self) -> Iterator[CrashState]:
        for p in range(self.n + 1):
            ops = self.unsynced(p)
            ranges = [range(c) for c in self.outcome_counts(p)]
            for combo in itertools.product(*ranges):
                yield CrashState(p, tuple((i, o) for i, o in zip(ops, combo, strict=True) if o != KEEP))

    def select(self, budget: int, rng: random.Random) -> tuple[list[CrashState], bool]:
        """Every state when the space fits ``budget`` (True), else a seeded sample (False).

        A sample always holds, for every crash point it can afford, the state keeping
        everything and the state dropping everything uncovered; the rest are drawn uniformly
        (point first, then one fate per uncovered operation).
        """
        if self.total(budget) <= budget:
            return list(self.enumerate()), True
        base: list[CrashState] = []
        for p in range(self.n + 1):
            base.append(CrashState(p))
            ops = self.unsynced(p)
            if self.model.subsets and ops:
                base.append(CrashState(p, tuple((i, DROP) for i in ops)))
        if len(base) >= budget:
            picked = rng.sample(base, budget)
            picked.sort(key=lambda s: s.point)
            return picked, False
        seen = {s.ident for s in base}
        out = list(base)
        attempts = 0
        while len(out) < budget and attempts < budget * 20:
            attempts += 1
            p = rng.randrange(self.n + 1)
            ops = self.unsynced(p)
            counts = self.outcome_counts(p)
            fates = [rng.randrange(c) for c in counts]
            state = CrashState(p, tuple((i, o) for i, o in zip(ops, fates, strict=True) if o != KEEP))
            if state.ident not in seen:
                seen.add(state.ident)
                out.append(state)
        out.sort(key=lambda s: s.point)
        return out, False

    def check(self, state: CrashState) -> None:
        """Refuse an ident this space could not have produced (for replaying a report)."""
        if not 0 <= state.point <= self.n:
            raise ValueError(f"crash point {state.point} outside 0..{self.n}")
        allowed = set(self.unsynced(state.point))
        for i, o in state.choice:
            if i not in allowed:
                raise ValueError(f"op {i} is not uncovered at crash point {state.point}")
            if not 0 <= o < self.model.outcomes(self.ops[i]):
                raise ValueError(f"outcome {o} not allowed for op {i} under {self.model.name}")

    def describe(self, state: CrashState) -> str:
        """A human account of the state: where it crashed and what it lost or tore."""
        last = self.ops[state.point - 1] if state.point else None
        text = f"crash after op {state.point}/{self.n}"
        if last is not None:
            text += f" ({_op_text(last)})"
        fates = [
            f"op {i} {_op_text(self.ops[i])} {self.model.describe(self.ops[i], o)}" for i, o in state.choice
        ]
        if fates:
            text += "; " + "; ".join(fates)
        return text

    # -- building ----------------------------------------------------------------------------
    def build(self, state: CrashState, seed: int) -> Tree:
        baseline = self.recording.baseline
        fs = _Fs(
            dirs=set(baseline.dirs),
            entries={},
        )
        for f in baseline.files:
            head, _, name = f.path.rpartition("/")
            fs.entries[(head, name)] = f.ino
            fs.data[f.ino] = bytearray(f.data)
        fates = dict(state.choice)
        for i in range(state.point):
            outcome = fates.get(i, KEEP)
            if outcome == DROP:
                continue
            op = self.ops[i]
            if outcome != KEEP:
                assert isinstance(op, Write)
                rng = random.Random(f"{seed}/{state.ident}/{i}")
                _apply_torn(fs, op, self.model.torn_fates(op, outcome), rng, self.model.whole_sectors)
            else:
                _apply(fs, op)
        return _tree(fs)


def _apply(fs: _Fs, op: DiskOp) -> None:
    if isinstance(op, Write):
        _write(fs.buf(op.ino), op.offset, op.data)
    elif isinstance(op, Truncate):
        buf = fs.buf(op.ino)
        if op.length < len(buf):
            del buf[op.length :]
        else:
            buf.extend(bytes(op.length - len(buf)))
    elif isinstance(op, Fallocate):
        buf = fs.buf(op.ino)
        end = op.offset + op.length
        if end > len(buf):
            buf.extend(bytes(end - len(buf)))
    elif isinstance(op, Create):
        fs.entries[(op.dir, op.name)] = op.ino
        fs.buf(op.ino)
    elif isinstance(op, Rename):
        if fs.entries.get((op.src_dir, op.src_name)) == op.ino:
            del fs.entries[(op.src_dir, op.src_name)]
        fs.entries[(op.dst_dir, op.dst_name)] = op.ino
    elif isinstance(op, Unlink):
        if fs.entries.get((op.dir, op.name)) == op.ino:
            del fs.entries[(op.dir, op.name)]
    elif isinstance(op, Mkdir):
        fs.dirs.add(_join(op.dir, op.name))
    elif isinstance(op, Rmdir):
        path = _join(op.dir, op.name)
        fs.dirs.discard(path)
        for key in [k for k in fs.entries if k[0] == path]:
            del fs.entries[key]
    # Sync and SyncDir change nothing by themselves.


def _write(buf: bytearray, offset: int, data: bytes) -> None:
    if offset > len(buf):
        buf.extend(bytes(offset - len(buf)))
    buf[offset : offset + len(data)] = data


def _apply_torn(fs: _Fs, op: Write, fates: str, rng: random.Random, whole_sectors: bool) -> None:
    buf = fs.buf(op.ino)
    end = op.offset + len(op.data)
    for (start, stop), fate in zip(pieces(op.offset, len(op.data)), fates, strict=True):
        if fate == OLD:
            continue  # a hole past the end reads as zeros once a later piece extends the file
        if fate == NEW:
            _write(buf, start, op.data[start - op.offset : stop - op.offset])
            continue
        if whole_sectors:
            # The sector's other bytes go too, but never past what the file holds.
            start = start // SECTOR * SECTOR
            stop = min(start + SECTOR, max(len(buf), end))
        if fate == ZERO:
            _write(buf, start, bytes(stop - start))
        else:
            assert fate == GARBAGE
            _write(buf, start, rng.randbytes(stop - start))


def _tree(fs: _Fs) -> Tree:
    def reachable(d: str) -> bool:
        while d:
            if d not in fs.dirs:
                return False
            d = d.rpartition("/")[0]
        return True

    dirs = tuple(sorted(d for d in fs.dirs if d and reachable(d)))
    files = tuple(
        sorted(
            (_join(d, name), bytes(fs.data.get(ino, b"")))
            for (d, name), ino in fs.entries.items()
            if reachable(d)
        )
    )
    return Tree(dirs, files)


def _op_text(op: DiskOp) -> str:
    if isinstance(op, Write):
        return f"write ino{op.ino} [{op.offset}+{len(op.data)}]"
    if isinstance(op, Truncate):
        return f"truncate ino{op.ino} to {op.length}"
    if isinstance(op, Fallocate):
        return f"fallocate ino{op.ino} [{op.offset}+{op.length}]"
    if isinstance(op, Sync):
        return f"{'fdatasync' if op.data_only else 'fsync'} ino{op.ino}"
    if isinstance(op, SyncDir):
        return f"fsync dir {op.dir or '.'}"
    if isinstance(op, Create):
        return f"create {_join(op.dir, op.name)} (ino{op.ino})"
    if isinstance(op, Rename):
        return f"rename {_join(op.src_dir, op.src_name)} -> {_join(op.dst_dir, op.dst_name)}"
    if isinstance(op, Unlink):
        return f"unlink {_join(op.dir, op.name)}"
    if isinstance(op, Mkdir):
        return f"mkdir {_join(op.dir, op.name)}"
    return f"rmdir {_join(op.dir, op.name)}"

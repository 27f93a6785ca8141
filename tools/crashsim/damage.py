"""The ``damage`` family: state damaged after a kill must fail closed or open exactly.

Crash families enumerate what a power loss can leave. This family covers what a crash cannot
explain: a file deleted, truncated or overwritten with garbage, a MANIFEST restored from an
earlier copy, a secret gone. For a workload it runs the real system once, and after each
acknowledged operation copies the state directory as a ``kill -9`` would leave it (no clean
close). Each copy is then damaged in every way below and opened by the workload's real
recovery. Every case must end in one of two outcomes:

* ``fail_closed``: recovery refuses with a store, log or disk error (each names the path and
  the rule), or
* ``exact``: recovery holds exactly the acknowledged state (or that plus operations that
  were in flight, which a crash may also keep).

Anything else is a violation: ``silent_loss`` (opened holding an earlier prefix: acknowledged
work gone), ``wrong`` (opened holding a state no prefix explains) or ``unnamed`` (refused
with an error that is not one of the fail-closed kinds, e.g. a traceback).

``segment-rollback`` and ``tail-zeroed`` (``rollback.py``) roll a segment back to an older
copy, or zero the last writes of the log: only the HIGHWATER mark tells those from a crash.

``tail_bitflip`` flips one bit of the last WAL frame (in its marker, length, lsn,
batch_start, checksum or payload): a kill leaves that frame after the last MANIFEST write, so
no evidence but the write's shadow copy can tell the damage from a torn write.

Targets are the store's files: ``MANIFEST``, ``HIGHWATER``, ``CATALOG``, ``secret``, ``owner.db``,
``records/*`` and ``wal/*``. Blob files are not damaged here (their loss is checked by the blob store when a
record is read).

Damage to the directory as a whole (``DIRECTORY_KINDS``, issue 29):

* ``emptied-log``: ``MANIFEST``, every log slot and the log's ``HIGHWATER`` deleted;
  ``emptied``: also ``CATALOG`` and the record files. Opening as a new, empty store is a ``silent_loss``.
* ``lock-deleted``: a first owner opens the state, ``owner.db`` is deleted, and a second owner
  starts (in this process: its locks conflict exactly as another process's would). Refused,
  and the first owner notices it lost its lock file: ``fail_closed``. A second owner that
  opens is ``unsafe_open``, or ``silent_loss`` when, after each owner acknowledged a write
  and both stopped, the first owner's write is gone.
* ``guard-replaced``: the rollback guard ``records-v2/ROLLBACK-GUARD`` (planted as a first
  claim writes it) replaced by a dangling symlink, a symlink, a directory, a 0644 file, a
  hard link or (as root) a file of another owner. Opening over it is ``unsafe_open``.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from afterword.disk import DiskError, NoSyncDisk
from afterword.legacy.formats import GUARD_PATH, GUARD_TEXT
from afterword.store import OwnershipLostError, Put, RecordStore, StoreError
from afterword.wal import WalError
from afterword.wal.layout import SEGMENT_HEADER_SIZE, Frame, decode_frame_at, decode_segment_header

from .rollback import ROLLBACK_KINDS, rollback_cases, rolled_back
from .runner import Scratch
from .workloads import ACKED, Journal, Observation, Workload

DAMAGE_WORKLOADS = ("store-tx", "checkpoint", "blobs")
OUTCOMES = ("fail_closed", "exact", "silent_loss", "wrong", "unnamed", "unsafe_open")
_VIOLATIONS = ("silent_loss", "wrong", "unnamed", "unsafe_open")
KINDS = (
    "delete",
    "truncate-0",
    "truncate-half",
    "garbage",
    "tail_bitflip",
    "manifest-rollback",
    *ROLLBACK_KINDS,
)
DIRECTORY_KINDS = ("emptied-log", "emptied", "lock-deleted", "guard-replaced")
# How guard-replaced replaces the guard (Case.version indexes this).
GUARD_DAMAGE = ("dangling-symlink", "symlink", "directory", "mode-0644", "hard-link", "foreign-owner")
_PROBES = ("lock-probe:first", "lock-probe:second")
# Byte offsets inside a frame that tail_bitflip hits, one per field (the payload is found
# at run time): marker, length, lsn, batch_start, checksum.
_FRAME_FIELDS = (
    ("marker", 1),
    ("length", 5),
    ("lsn", 9),
    ("batch_start", 17),
    ("checksum", 25),
    ("payload", -1),
)
_TARGET_DIRS = ("records", "wal")
_TOP_FILES = ("MANIFEST", "CATALOG", "secret", "HIGHWATER")
_FAIL_CLOSED = (StoreError, WalError, DiskError)
_DISK = NoSyncDisk()


@dataclass(frozen=True)
class Snapshot:
    """The state directory right after ``acked`` operations were acknowledged."""

    acked: int
    files: dict[str, bytes]  # relative path -> bytes (owner.db left out: its bytes are no state)


@dataclass(frozen=True)
class Case:
    snapshot: int  # index into the snapshots
    kind: str
    target: str  # relative path damaged
    # manifest-rollback: index of the earlier MANIFEST; tail_bitflip: field; segment-rollback:
    # the snapshot whose copy of the segment is put back; tail-zeroed: how many writes
    version: int = -1

    @property
    def ident(self) -> str:
        extra = f"@{self.version}" if self.version >= 0 else ""
        return f"{self.snapshot}:{self.kind}:{self.target}{extra}"


@dataclass
class DamageResult:
    workload: str
    seed: int
    ops: int
    snapshots: int
    space: int  # cases that could be run
    counts: dict[str, Counter[str]] = field(default_factory=dict)  # kind -> outcome -> cases
    examples: list[str] = field(default_factory=list)  # violations, reproducible by ident
    seconds: float = 0.0

    @property
    def cases(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())

    def total(self, outcome: str) -> int:
        return sum(c[outcome] for c in self.counts.values())

    @property
    def violations(self) -> int:
        return sum(self.total(o) for o in _VIOLATIONS)


def _read_tree(state_dir: str) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for name in _TOP_FILES:
        path = os.path.join(state_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                files[name] = fh.read()
    for sub in (*_TARGET_DIRS, "blobs", "records-v2"):
        base = os.path.join(state_dir, sub)
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            if os.path.isfile(path):
                with open(path, "rb") as fh:
                    files[f"{sub}/{name}"] = fh.read()
    return files


def record_snapshots(workload: Workload, scratch: Scratch) -> list[Snapshot]:
    """Run ``workload`` for real and copy its state after every acknowledged operation."""
    state_dir = os.path.join(scratch.fresh(), "state")
    snapshots: list[Snapshot] = []
    journal: Journal

    def mark(kind: str, op: int, note: str) -> None:
        if kind == "ack":
            acked = sum(1 for o in journal.outcomes.values() if o == ACKED)
            snapshots.append(Snapshot(acked, _read_tree(state_dir)))

    journal = Journal(mark)
    workload.run(state_dir, _DISK, journal)
    return snapshots


def last_frame(files: dict[str, bytes]) -> tuple[str, Frame] | None:
    """The WAL's last written frame: the last whole frame of the segment with the highest seq."""
    best: tuple[int, str, Frame] | None = None
    for rel, data in files.items():
        if not (rel.startswith("wal/") and rel.endswith(".seg")):
            continue
        header = decode_segment_header(data)
        if header is None:
            continue
        offset, frame = SEGMENT_HEADER_SIZE, None
        while (nxt := decode_frame_at(data, offset, header.salt, len(data))) is not None:
            frame, offset = nxt, nxt.end
        if frame is not None and (best is None or header.seq > best[0]):
            best = (header.seq, rel, frame)
    return None if best is None else (best[1], best[2])


def enumerate_cases(snapshots: Sequence[Snapshot]) -> list[Case]:
    cases: list[Case] = []
    manifests: list[bytes] = []
    for i, snap in enumerate(snapshots):
        for target, data in sorted(snap.files.items()):
            if target.split("/")[0] in ("blobs", "records-v2"):
                continue
            cases.append(Case(i, "delete", target))
            if data:
                cases.append(Case(i, "truncate-0", target))
                cases.append(Case(i, "garbage", target))
            if len(data) > 1:
                cases.append(Case(i, "truncate-half", target))
        cases.append(Case(i, "garbage", "owner.db"))
        tail = last_frame(snap.files)
        if tail is not None:
            for field_index, (name, _) in enumerate(_FRAME_FIELDS):
                if name != "payload" or tail[1].payload:
                    cases.append(Case(i, "tail_bitflip", tail[0], field_index))
        cases += _directory_cases(i)
        current = snap.files.get("MANIFEST")
        for v, old in enumerate(manifests):
            if old != current:
                cases.append(Case(i, "manifest-rollback", "MANIFEST", v))
        if current is not None and (not manifests or manifests[-1] != current):
            manifests.append(current)
    cases += [Case(*spec) for spec in rollback_cases(snapshots)]
    return cases


def _directory_cases(snapshot: int) -> list[Case]:
    cases = [
        Case(snapshot, "emptied-log", "MANIFEST"),
        Case(snapshot, "emptied", "MANIFEST"),
        Case(snapshot, "lock-deleted", "owner.db"),
    ]
    for v, how in enumerate(GUARD_DAMAGE):
        if how != "foreign-owner" or os.geteuid() == 0:  # only root can give a file away
            cases.append(Case(snapshot, "guard-replaced", GUARD_PATH, v))
    return cases


def _manifest_versions(snapshots: Sequence[Snapshot]) -> list[bytes]:
    versions: list[bytes] = []
    for snap in snapshots:
        current = snap.files.get("MANIFEST")
        if current is not None and (not versions or versions[-1] != current):
            versions.append(current)
    return versions


def _materialize(state_dir: str, files: dict[str, bytes]) -> None:
    os.mkdir(state_dir, 0o700)
    for rel, data in files.items():
        head, _, _ = rel.rpartition("/")
        if head and not os.path.isdir(os.path.join(state_dir, head)):
            os.mkdir(os.path.join(state_dir, head), 0o700)
        fd = os.open(os.path.join(state_dir, rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    for sub in _TARGET_DIRS:
        os.makedirs(os.path.join(state_dir, sub), mode=0o700, exist_ok=True)


def damaged_files(case: Case, snapshots: Sequence[Snapshot], seed: int) -> dict[str, bytes]:
    files = dict(snapshots[case.snapshot].files)
    rng = random.Random(f"{seed}/{case.ident}")
    data = files.get(case.target, b"")
    if case.kind == "delete":
        files.pop(case.target, None)
    elif case.kind == "truncate-0":
        files[case.target] = b""
    elif case.kind == "truncate-half":
        files[case.target] = data[: len(data) // 2]
    elif case.kind == "garbage":
        files[case.target] = rng.randbytes(max(len(data), 4096 if case.target == "owner.db" else 1))
    elif case.kind == "tail_bitflip":
        found = last_frame(files)
        assert found is not None and found[0] == case.target
        frame = found[1]
        at = _FRAME_FIELDS[case.version][1]
        at = frame.offset + (at if at >= 0 else 32 + rng.randrange(len(frame.payload)))
        flipped = bytearray(data)
        flipped[at] ^= 1 << rng.randrange(8)
        files[case.target] = bytes(flipped)
    elif case.kind == "manifest-rollback":
        files["MANIFEST"] = _manifest_versions(snapshots)[case.version]
    elif case.kind in ROLLBACK_KINDS:
        rolled_back(case, snapshots, files)
    elif case.kind in ("emptied-log", "emptied"):
        # The log's HIGHWATER mark goes with the log: the refusal must rest on what remains.
        log = ("wal/", "HIGHWATER")
        gone = log if case.kind == "emptied-log" else (*log, "records/", "CATALOG")
        files = {rel: data for rel, data in files.items() if rel != "MANIFEST" and not rel.startswith(gone)}
    elif case.kind == "guard-replaced":
        files[GUARD_PATH] = GUARD_TEXT  # as the first claim wrote it; replaced in place below
    return files


def _replace_guard(state_dir: str, how: str) -> None:
    guard = os.path.join(state_dir, GUARD_PATH)
    outside = os.path.join(os.path.dirname(state_dir), "guard-elsewhere")
    if how == "dangling-symlink":
        os.unlink(guard)
        os.symlink(outside, guard)
    elif how == "symlink":
        os.rename(guard, outside)
        os.symlink(outside, guard)
    elif how == "directory":
        os.unlink(guard)
        os.mkdir(guard, 0o700)
    elif how == "mode-0644":
        os.chmod(guard, 0o644)
    elif how == "hard-link":
        os.link(guard, outside)
    elif how == "foreign-owner":
        os.chown(guard, 12345, 12345)


def classify_second_owner(workload: Workload, state_dir: str) -> tuple[str, str]:
    """A first owner holds ``state_dir``; ``owner.db`` is deleted; a second owner starts."""
    options = getattr(workload, "options", None)
    first = RecordStore.open(state_dir, disk=_DISK, options=options)
    try:
        os.unlink(os.path.join(state_dir, "owner.db"))
        try:
            second = RecordStore.open(state_dir, disk=_DISK, options=options)
        except _FAIL_CLOSED as exc:
            refused = f"{type(exc).__name__}: {exc}"
        else:
            try:  # two owners, each acknowledging a write of its own
                first.transact_sync([Put(_PROBES[0], b"acknowledged by the first owner")])
                second.transact_sync([Put(_PROBES[1], b"acknowledged by the second owner")])
            finally:
                second.close()
                first.close()
            return _after_two_owners(workload, state_dir)
        try:
            first.check_ownership()
        except OwnershipLostError:
            return "fail_closed", refused
        return (
            "unsafe_open",
            "the second owner was refused, but the first kept its place without its lock file",
        )
    finally:
        first.close()


def _after_two_owners(workload: Workload, state_dir: str) -> tuple[str, str]:
    try:
        after = RecordStore.open(state_dir, disk=_DISK, options=getattr(workload, "options", None))
    except _FAIL_CLOSED as exc:
        return "unsafe_open", f"a second owner opened beside the first (the next open refused: {exc})"
    try:
        lost = [key for key in _PROBES if after.get(key) is None]
    finally:
        after.close()
    if lost:
        return "silent_loss", f"a second owner opened beside the first; acknowledged {', '.join(lost)} gone"
    return "unsafe_open", "a second owner opened beside the first"


def classify(workload: Workload, acked: int, recover: Callable[[], Observation]) -> tuple[str, str]:
    """Run ``recover`` and name the outcome, with a detail for violations."""
    try:
        seen = recover()
    except _FAIL_CLOSED as exc:
        return "fail_closed", f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # any other error is the finding (a traceback for the operator)
        return "unnamed", f"{type(exc).__name__}: {exc}"
    seen = dict(seen)
    for p in range(acked, workload.ops + 1):
        if dict(workload.expect(range(1, p + 1))) == seen:
            return "exact", ""
    for p in range(acked):
        if dict(workload.expect(range(1, p + 1))) == seen:
            return "silent_loss", f"opened with {p} of {acked} acknowledged operations"
    return "wrong", "opened with a state no prefix of the operations explains"


def run_damage(
    workload: Workload,
    scratch: Scratch,
    *,
    budget: int | None = None,
    only: str | None = None,
    kinds: Sequence[str] | None = None,
) -> DamageResult:
    """Damage every (or a ``budget`` sample per kind of) case of ``kinds`` (default: all)
    and classify each recovery."""
    began = time.perf_counter()
    snapshots = record_snapshots(workload, scratch)
    cases = [c for c in enumerate_cases(snapshots) if kinds is None or c.kind in kinds]
    result = DamageResult(workload.name, workload.seed, workload.ops, len(snapshots), len(cases))
    if only is not None:
        cases = [c for c in cases if c.ident == only]
    elif budget is not None:
        rng = random.Random(f"{workload.name}/{workload.seed}/damage")
        picked: list[Case] = []
        for kind in (*KINDS, *DIRECTORY_KINDS):
            of_kind = [c for c in cases if c.kind == kind]
            picked += of_kind if len(of_kind) <= budget else rng.sample(of_kind, budget)
        cases = picked
    for case in cases:
        state_dir = os.path.join(scratch.fresh(), "state")
        _materialize(state_dir, damaged_files(case, snapshots, workload.seed))
        acked = snapshots[case.snapshot].acked
        if case.kind == "lock-deleted":
            outcome, detail = classify_second_owner(workload, state_dir)
        else:
            if case.kind == "guard-replaced":
                _replace_guard(state_dir, GUARD_DAMAGE[case.version])
            outcome, detail = classify(workload, acked, lambda d=state_dir: workload.recover(d, _DISK))
            if case.kind == "guard-replaced" and outcome == "exact":
                outcome, detail = (
                    "unsafe_open",
                    f"opened over a guard replaced by a {GUARD_DAMAGE[case.version]}",
                )
        result.counts.setdefault(case.kind, Counter())[outcome] += 1
        if outcome not in ("fail_closed", "exact"):
            result.examples.append(
                f"{workload.name} seed {workload.seed} case {case.ident}: {outcome}: {detail}"
            )
        shutil.rmtree(os.path.dirname(state_dir), ignore_errors=True)
    result.seconds = time.perf_counter() - began
    return result


_HEADER = ("workload", "seed", "snapshots", "kind", "cases", *OUTCOMES)


def render_damage(results: Sequence[DamageResult], *, max_examples: int = 5) -> str:
    from .report import _table

    rows: list[tuple[object, ...]] = []
    for r in results:
        for kind in (*KINDS, *DIRECTORY_KINDS):
            c = r.counts.get(kind, Counter())
            if not c:
                continue  # a kind left out of this run (--kind, --case)
            rows.append((r.workload, r.seed, r.snapshots, kind, sum(c.values()), *(c[o] for o in OUTCOMES)))
    lines = ["damage", *_table(_HEADER, rows), ""]
    total = sum(r.cases for r in results)
    lines.append(
        f"{total} damage cases: {sum(r.total('fail_closed') for r in results)} failed closed, "
        f"{sum(r.total('exact') for r in results)} opened exactly, "
        f"{sum(r.total('silent_loss') for r in results)} silent losses, "
        f"{sum(r.violations for r in results)} violations, {sum(r.seconds for r in results):.1f} s"
    )
    examples = [e for r in results for e in r.examples]
    lines += [f"  {e}" for e in examples[:max_examples]]
    return "\n".join(lines)

"""The simulator's driver: record a workload, build its crash states, recover and check each.

For one (workload, seed, model) the :class:`Explorer`

1. runs the workload once under the :class:`Recorder` (the recording);
2. selects crash states: all of them when the space fits the budget, else a seeded sample;
3. for each state builds the file tree, checks its record files, and (once per distinct tree)
   materializes it in a fresh owner-only directory and runs, in order: the real recovery
   (itself recorded), the workload's checks on the recovered state, a second recovery that
   must expose the same thing, recovery again from states a crash *during* the first
   recovery can leave, and the workload's probe (keep writing on the recovered state);
4. compares the recovered records with the prefixes the acknowledgements allow.

:func:`run_faults` does the I/O-error side: one run per fault plan, then a reopen and checks.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from afterword.disk import OsDisk, is_temp_name

from .checkers import (
    Expectations,
    Finding,
    Violation,
    candidate_histories,
    check_histories,
    check_prefix,
    compare,
    findings,
)
from .faults import DURABILITY_KINDS, KINDS, FaultPlan, FaultyDisk, plans
from .model import Model
from .recorder import Mark, Recorder, Recording, Sync, SyncDir
from .states import CrashState, StateSpace, Tree
from .workloads import ACKED, UNKNOWN, Journal, Observation, Workload


class Scratch:
    """Fresh owner-only directories under one work directory (tmpfs when available)."""

    def __init__(self, workdir: str | None = None) -> None:
        if workdir is None:
            shm = "/dev/shm"
            parent = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
        else:
            os.makedirs(workdir, mode=0o700, exist_ok=True)
            parent = workdir
        self.root = tempfile.mkdtemp(prefix="crashsim-", dir=parent)
        os.chmod(self.root, 0o700)

    def fresh(self) -> str:
        return tempfile.mkdtemp(dir=self.root)  # mode 0700

    def discard(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Settings:
    budget: int | None = 400  # crash states per workload and model; None: every state
    recovery_budget: int = 16  # crash states per recovery log (crash during recovery)
    probe: bool = True
    fault_budget: int | None = 24  # fault plans per workload; None: every plan
    fault_kinds: tuple[str, ...] = KINDS


@dataclass
class ModelResult:
    workload: str
    model: str
    seed: int
    ops: int
    fingerprint: str
    disk_ops: int
    space: int  # states in the whole space (saturated at the budget + 1 when sampled)
    exhaustive: bool
    states: int = 0  # crash states checked
    trees: int = 0  # distinct trees recovered
    recovery_states: int = 0  # states checked after a crash during recovery
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class FaultResult:
    workload: str
    seed: int
    ops: int
    calls: dict[str, int]
    plans: int = 0
    exhaustive: bool = False
    injected: int = 0  # plans whose fault actually fired
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0


def record(workload: Workload, scratch: Scratch) -> Recording:
    """Run ``workload`` once under the recorder and return the log."""
    base = scratch.fresh()
    try:
        recorder = Recorder(base)
        workload.run(os.path.join(base, workload.state_subdir), recorder, Journal(recorder.mark))
        return recorder.recording()
    finally:
        scratch.discard(base)


def _changes_something(recording: Recording) -> bool:
    return any(not isinstance(e, Mark | Sync | SyncDir) for e in recording.entries)


@dataclass
class _TreeVerdict:
    observation: Observation | None
    findings: list[Finding]
    facts: Mapping[str, str] = field(default_factory=dict)


class Explorer:
    """Crash states of one workload run under one persistence model."""

    def __init__(
        self,
        workload: Workload,
        model: Model,
        settings: Settings,
        scratch: Scratch,
        recording: Recording | None = None,
    ) -> None:
        self.workload = workload
        self.model = model
        self.settings = settings
        self.scratch = scratch
        self.recording = recording if recording is not None else record(workload, scratch)
        self.space = StateSpace(self.recording, model)
        self.fingerprint = self.recording.fingerprint()
        self.expect = Expectations(workload)
        self._trees: dict[str, _TreeVerdict] = {}
        self._files: dict[tuple[str, int], list[Finding]] = {}
        self.recovery_states = 0

    @property
    def seed(self) -> int:
        return self.workload.seed

    def run(self) -> ModelResult:
        began = time.perf_counter()
        budget = self.settings.budget
        rng = random.Random(f"{self.workload.name}/{self.seed}/{self.model.name}")
        if budget is None:
            states, exhaustive = list(self.space.enumerate()), True
            space = len(states)
        else:
            states, exhaustive = self.space.select(budget, rng)
            space = self.space.total(budget) if not exhaustive else len(states)
        result = ModelResult(
            workload=self.workload.name,
            model=self.model.name,
            seed=self.seed,
            ops=self.workload.ops,
            fingerprint=self.fingerprint,
            disk_ops=self.space.n,
            space=space,
            exhaustive=exhaustive,
        )
        for state in states:
            result.violations += self.check(state)
            result.states += 1
        result.trees = len(self._trees)
        result.recovery_states = self.recovery_states
        result.seconds = time.perf_counter() - began
        return result

    def violation(self, state: CrashState, finding: Finding) -> Violation:
        return Violation(
            workload=self.workload.ref(),
            model=self.model.name,
            seed=self.seed,
            ops=self.workload.ops,
            state=state.ident,
            checker=finding.checker,
            detail=finding.detail,
            where=self.space.describe(state),
            fingerprint=self.fingerprint,
        )

    def check(self, state: CrashState) -> list[Violation]:
        """All checks of one crash state; tree-level findings are reported once per tree."""
        tree = self.space.build(state, self.seed)
        lo, hi = self.space.bounds(state.point)
        out = [self.violation(state, f) for f in self._file_findings(tree, hi)]
        verdict = self._trees.get(tree.digest)
        if verdict is None:
            verdict = self.analyse(tree)
            self._trees[tree.digest] = verdict
            out += [self.violation(state, f) for f in verdict.findings]
        if verdict.observation is not None:
            out += [self.violation(state, f) for f in check_prefix(self.expect, verdict.observation, lo, hi)]
            for name, value in self.space.facts(state.point).items():
                if verdict.facts.get(name) != value:
                    finding = Finding(
                        "fact-changed", f"{name} was {value}, recovered {verdict.facts.get(name)}"
                    )
                    out.append(self.violation(state, finding))
        return out

    def _file_findings(self, tree: Tree, hi: int) -> list[Finding]:
        key = (tree.digest, hi)
        found = self._files.get(key)
        if found is None:
            files = tree.under(self.workload.state_subdir)
            found = findings("record-file", self.workload.file_problems(files, [range(1, hi + 1)]))
            self._files[key] = found
        return found

    def analyse(self, tree: Tree) -> _TreeVerdict:
        """Recover one materialized tree and run every tree-level check on it."""
        workload = self.workload
        base = self.scratch.fresh()
        try:
            tree.materialize(base)
            state_dir = os.path.join(base, workload.state_subdir)
            recorder = Recorder(base)
            try:
                seen = workload.recover(state_dir, recorder)
            except Exception as exc:
                return _TreeVerdict(None, [Finding("recovery-failed", f"{type(exc).__name__}: {exc}")])
            found = findings("state", workload.state_problems(state_dir, seen))
            found += _temporaries(state_dir)
            try:
                facts = workload.facts(state_dir)
            except Exception as exc:
                facts = {}
                found.append(Finding("fact-changed", f"reading facts failed: {type(exc).__name__}: {exc}"))
            try:
                again = workload.recover(state_dir, OsDisk())
            except Exception as exc:
                found.append(
                    Finding("replay-not-idempotent", f"second recovery failed: {type(exc).__name__}: {exc}")
                )
            else:
                found += compare("second recovery", "replay-not-idempotent", seen, again)
            found += self._recovery_crashes(recorder.recording(), tree, seen)
            if self.settings.probe:
                found += self._probe(tree, seen)
            return _TreeVerdict(seen, found, facts)
        finally:
            self.scratch.discard(base)

    def _probe(self, tree: Tree, seen: Observation) -> list[Finding]:
        """The probe recovers its own fresh copy: some damage (say, a sequence number reused
        after a repair) only shows when the session that recovered goes on writing."""
        base = self.scratch.fresh()
        try:
            tree.materialize(base)
            state_dir = os.path.join(base, self.workload.state_subdir)
            return findings("probe", self.workload.probe(state_dir, seen))
        finally:
            self.scratch.discard(base)

    def _recovery_crashes(self, recording: Recording, tree: Tree, seen: Observation) -> list[Finding]:
        """Crash the recovery itself at every point it can afford, recover again: the second
        recovery must expose exactly what the uninterrupted one did."""
        if not _changes_something(recording) or self.settings.recovery_budget <= 0:
            return []
        space = StateSpace(recording, self.model)
        rng = random.Random(f"{self.seed}/{tree.digest}/{self.model.name}")
        states, _ = space.select(self.settings.recovery_budget, rng)
        done: set[str] = {tree.digest}
        out: list[Finding] = []
        for state in states:
            inner = space.build(state, self.seed)
            if inner.digest in done:
                continue
            done.add(inner.digest)
            self.recovery_states += 1
            base = self.scratch.fresh()
            try:
                inner.materialize(base)
                try:
                    again = self.workload.recover(os.path.join(base, self.workload.state_subdir), OsDisk())
                except Exception as exc:
                    out.append(
                        Finding(
                            "recovery-crash",
                            f"crash during recovery ({space.describe(state)}), then recovery failed: "
                            f"{type(exc).__name__}: {exc}",
                        )
                    )
                    continue
                out += compare(
                    f"crash during recovery ({space.describe(state)})", "recovery-crash", seen, again
                )
            finally:
                self.scratch.discard(base)
        return out


def explore(workload: Workload, model: Model, settings: Settings, scratch: Scratch) -> ModelResult:
    return Explorer(workload, model, settings, scratch).run()


@dataclass(frozen=True)
class Unit:
    """One independent piece of a run: a model's crash states, or the fault plans (model None)."""

    workload: str  # a registered name or module:Class
    seed: int
    ops: int | None
    model: str | None


def run_unit(unit: Unit, settings: Settings, workdir: str | None = None) -> ModelResult | FaultResult:
    """Run one unit in its own scratch space (the entry point of parallel workers)."""
    from .model import get_model
    from .workloads import get_workload

    workload = get_workload(unit.workload)(seed=unit.seed, ops=unit.ops)
    with Scratch(workdir) as scratch:
        if unit.model is None:
            return run_faults(workload, settings, scratch)
        return explore(workload, get_model(unit.model), settings, scratch)


# -- I/O-error injection ----------------------------------------------------------------------
def count_calls(workload: Workload, scratch: Scratch) -> Counter[str]:
    base = scratch.fresh()
    try:
        disk = FaultyDisk()
        workload.run(os.path.join(base, workload.state_subdir), disk, Journal(lambda *_: None))
        return disk.counts
    finally:
        scratch.discard(base)


def run_faults(workload: Workload, settings: Settings, scratch: Scratch) -> FaultResult:
    began = time.perf_counter()
    counts = count_calls(workload, scratch)
    rng = random.Random(f"{workload.name}/{workload.seed}/faults")
    chosen, exhaustive = plans(counts, budget=settings.fault_budget, rng=rng, kinds=settings.fault_kinds)
    result = FaultResult(
        workload=workload.name,
        seed=workload.seed,
        ops=workload.ops,
        calls={k: counts[k] for k in settings.fault_kinds},
        plans=len(chosen),
        exhaustive=exhaustive,
    )
    for plan in chosen:
        fired, violations = run_fault(workload, plan, settings, scratch)
        result.injected += fired
        result.violations += violations
    result.seconds = time.perf_counter() - began
    return result


def run_fault(
    workload: Workload, plan: FaultPlan, settings: Settings, scratch: Scratch
) -> tuple[bool, list[Violation]]:
    """One run with ``plan`` injected, then a clean reopen and every check on the result."""

    def violation(finding: Finding) -> Violation:
        return Violation(
            workload=workload.ref(),
            model="faults",
            seed=workload.seed,
            ops=workload.ops,
            state=plan.ident,
            checker=finding.checker,
            detail=finding.detail,
        )

    base = scratch.fresh()
    try:
        state_dir = os.path.join(base, workload.state_subdir)
        holder: list[Recorder] = []
        faulty = FaultyDisk(plan=plan, on_fault=lambda text: holder[0].mark("fault", 0, text))
        recorder = Recorder(base, faulty)
        holder.append(recorder)
        journal = Journal(recorder.mark, tolerant=True)
        found: list[Finding] = []
        try:
            workload.run(state_dir, recorder, journal)
        except Exception as exc:
            found.append(Finding("unexpected-exception", f"workload run: {type(exc).__name__}: {exc}"))
        if not faulty.injected:
            return False, []
        found += _acks_after_failure(recorder.recording(), plan)
        acked = [op for op, o in journal.outcomes.items() if o == ACKED]
        unknown = [op for op, o in journal.outcomes.items() if o == UNKNOWN]
        left = _snapshot(base)  # as the failed run left it, for the probe's own first recovery
        try:
            seen = workload.recover(state_dir, OsDisk())
        except Exception as exc:
            found.append(Finding("integrity", f"reopen after the fault failed: {type(exc).__name__}: {exc}"))
            return True, [violation(f) for f in found]
        found += _temporaries(state_dir)
        histories = candidate_histories(acked, unknown)
        match = None
        if histories is not None:
            problems, match = check_histories(workload, seen, histories)
            found += problems
        if match is not None:  # without one, the integrity finding already says what is wrong
            found += findings("record-file", workload.file_problems(_read_tree(state_dir), [match]))
        found += findings("state", workload.state_problems(state_dir, seen))
        if settings.probe:
            probe_base = scratch.fresh()
            try:
                left.materialize(probe_base)
                found += findings(
                    "probe", workload.probe(os.path.join(probe_base, workload.state_subdir), seen)
                )
            finally:
                scratch.discard(probe_base)
        return True, [violation(f) for f in found]
    finally:
        scratch.discard(base)


def _acks_after_failure(recording: Recording, plan: FaultPlan) -> list[Finding]:
    """After a durability failure nothing may be acknowledged until the state is reopened.

    Exception: ENOSPC on a write. Where it hits a temporary file or a segment being created,
    nothing durable changed and the store refuses only that write (``StorageFullError``)
    and goes on; the integrity checker still requires the reopened state to hold exactly
    the acknowledged operations. ENOSPC anywhere else still poisons the store, except where
    the operation it hit was refused with ``StorageFullError`` (the fsync of a segment being
    created, say): the store said nothing durable changed, and the integrity check holds it
    to that.
    """
    if plan.kind not in DURABILITY_KINDS or (plan.kind == "write" and plan.errno == "ENOSPC"):
        return []
    failed_at: str | None = None
    late: list[int] = []
    for entry in recording.entries:
        if not isinstance(entry, Mark):
            continue
        if entry.kind == "fault" and failed_at is None:
            failed_at = entry.note
        elif entry.kind in ("fail", "note") and "StorageFullError" in entry.note and plan.errno == "ENOSPC":
            failed_at = None  # refused as "disk full, nothing changed", not a poisoned store
        elif entry.kind == "note" and entry.note.startswith("opened"):
            failed_at = None  # a successful reopen recovered from the failure
        elif entry.kind == "ack" and failed_at is not None:
            late.append(entry.op)
    if not late:
        return []
    return [Finding("ack-after-failure", f"ops {late} acknowledged after {plan.ident} failed")]


def _temporaries(state_dir: str) -> list[Finding]:
    left = []
    for dirpath, _, filenames in os.walk(state_dir):
        for name in filenames:
            if is_temp_name(name):
                left.append(os.path.relpath(os.path.join(dirpath, name), state_dir))
    return findings("temp-left", [f"temporary {p} survived the reopen" for p in sorted(left)])


def _snapshot(base: str) -> Tree:
    """The tree under ``base`` (without the lock database, which an opener recreates)."""
    dirs: list[str] = []
    for dirpath, dirnames, _ in os.walk(base):
        dirs += [os.path.relpath(os.path.join(dirpath, d), base) for d in dirnames]
    files = _read_tree(base)
    return Tree(tuple(sorted(dirs)), tuple(sorted(files.items())))


def _read_tree(state_dir: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _, filenames in os.walk(state_dir):
        for name in filenames:
            full = os.path.join(dirpath, name)
            if name == "owner.db":
                continue  # opening and closing it would drop another store's POSIX lock
            with open(full, "rb") as fh:
                out[os.path.relpath(full, state_dir)] = fh.read()
    return out


def replay_state(
    workload: Workload,
    model: Model,
    ident: str,
    settings: Settings,
    scratch: Scratch,
    keep: str | None = None,
) -> tuple[ModelResult, str]:
    """Check one crash state again (from a report); ``keep`` copies its tree there."""
    explorer = Explorer(workload, model, settings, scratch)
    state = CrashState.parse(ident)
    explorer.space.check(state)
    began = time.perf_counter()
    violations = explorer.check(state)
    if keep is not None:
        os.makedirs(keep, mode=0o700, exist_ok=False)
        os.chmod(keep, 0o700)
        explorer.space.build(state, workload.seed).materialize(keep)
    result = ModelResult(
        workload=workload.name,
        model=model.name,
        seed=workload.seed,
        ops=workload.ops,
        fingerprint=explorer.fingerprint,
        disk_ops=explorer.space.n,
        space=1,
        exhaustive=False,
        states=1,
        trees=len(explorer._trees),
        recovery_states=explorer.recovery_states,
        violations=violations,
        seconds=time.perf_counter() - began,
    )
    return result, explorer.space.describe(state)

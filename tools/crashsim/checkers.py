"""Checkers: compare what recovery exposed with what the workload's history allows.

Each checker returns ``Finding``s (a checker name and a detail); the runner stamps them with
the workload, model, seed and state into ``Violation``s. Checker names:

``recovery-failed``        recovery raised on a state a crash can leave
``acknowledged-lost``      an acknowledged operation is missing after recovery
``phantom``                the state shows an operation that had not begun at the crash
``not-a-prefix``           the state equals no prefix of the operation history
``record-file``            a record file is torn or holds no committed version
``state``                  a workload check on the recovered state (e.g. referenced blobs)
``replay-not-idempotent``  recovering the recovered state again exposes something else
``recovery-crash``         a crash during recovery, then recovery again, went wrong
``probe``                  writing on after recovery lost or damaged data
``ack-after-failure``      an operation was acknowledged after an injected durability failure
``temp-left``              a temporary file survived a reopen
``integrity``              after injected I/O errors, the reopened state fits no allowed history
``unexpected-exception``   the system raised something a workload could not handle
``fact-changed``           a durable fact the workload declared (the token secret) changed
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from .workloads import Observation, Workload


@dataclass(frozen=True)
class Finding:
    checker: str
    detail: str


@dataclass(frozen=True)
class Violation:
    """One failed check, with everything needed to reproduce it."""

    workload: str
    model: str  # a persistence model, or "faults"
    seed: int
    ops: int
    state: str  # crash state ident, or fault plan ident
    checker: str
    detail: str
    where: str = ""  # a human account of the state
    fingerprint: str = ""  # of the recorded log, to confirm a replay rebuilt the same log

    def reproduce(self) -> str:
        if self.model == "faults":
            return (
                f"python -m tools.crashsim fault --workload {self.workload} --seed {self.seed} "
                f"--ops {self.ops} --plan '{self.state}'"
            )
        return (
            f"python -m tools.crashsim state --workload {self.workload} --model {self.model} "
            f"--seed {self.seed} --ops {self.ops} --state '{self.state}'"
            + (f" --fingerprint {self.fingerprint}" if self.fingerprint else "")
        )


class Expectations:
    """The workload's expected observation after each prefix (computed once)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._prefix: dict[int, Observation] = {}

    def prefix(self, p: int) -> Observation:
        found = self._prefix.get(p)
        if found is None:
            found = self.workload.expect(range(1, p + 1))
            self._prefix[p] = found
        return found


def diff(seen: Observation, wanted: Observation, limit: int = 3) -> str:
    """A short account of how ``seen`` differs from ``wanted``."""
    parts: list[str] = []
    for key in sorted(set(seen) | set(wanted)):
        a, b = seen.get(key), wanted.get(key)
        if a != b:
            parts.append(f"{key}: {_view(a)} (expected {_view(b)})")
    more = len(parts) - limit
    text = "; ".join(parts[:limit])
    return text + (f"; and {more} more" if more > 0 else "")


def _view(value: Hashable | None) -> str:
    if value is None:
        return "absent"
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[1], bytes):
        return f"lsn {value[0]}"
    return repr(value)[:40]


def check_prefix(expect: Expectations, seen: Observation, lo: int, hi: int) -> list[Finding]:
    """The recovered state must equal the state after some prefix ``p`` with lo <= p <= hi."""
    for p in range(lo, hi + 1):
        if expect.prefix(p) == seen:
            return []
    n = expect.workload.ops
    for p in range(lo - 1, -1, -1):
        if expect.prefix(p) == seen:
            return [
                Finding(
                    "acknowledged-lost",
                    f"recovered the state after op {p}, but ops up to {lo} were acknowledged",
                )
            ]
    for p in range(hi + 1, n + 1):
        if expect.prefix(p) == seen:
            return [
                Finding("phantom", f"recovered the state after op {p}, but only ops up to {hi} had begun")
            ]
    return [
        Finding(
            "not-a-prefix",
            f"recovered state is no prefix in {lo}..{hi}: vs op {lo}: {diff(seen, expect.prefix(lo))}",
        )
    ]


def candidate_histories(
    acked: Iterable[int], unknown: Iterable[int], limit: int = 1 << 16
) -> list[tuple[int, ...]] | None:
    """Every history holding all acknowledged ops plus any subset of those with unknown
    outcome, in op order; None when there are more than ``limit``."""
    acked, unknown = sorted(set(acked)), sorted(set(unknown))
    if 2 ** len(unknown) > limit:
        return None
    out = []
    for r in range(len(unknown) + 1):
        for extra in itertools.combinations(unknown, r):
            out.append(tuple(sorted((*acked, *extra))))
    return out


def check_histories(
    workload: Workload, seen: Observation, histories: Sequence[Sequence[int]]
) -> tuple[list[Finding], Sequence[int] | None]:
    """The state must equal ``expect(h)`` for one of ``histories``; returns the match."""
    for h in histories:
        if workload.expect(h) == seen:
            return [], h
    base = histories[0] if histories else ()
    return [
        Finding(
            "integrity",
            f"reopened state fits none of {len(histories)} allowed histories; "
            f"vs acknowledged only {list(base)}: {diff(seen, workload.expect(base))}",
        )
    ], None


def compare(stage: str, checker: str, first: Observation, second: Observation) -> list[Finding]:
    if first == second:
        return []
    return [Finding(checker, f"{stage}: {diff(second, first)}")]


def findings(checker: str, texts: Iterable[str]) -> list[Finding]:
    return [Finding(checker, t) for t in texts]

"""The kill test's verdict: account for every acknowledged claim from what the run observed.

Pure: it takes what the driver collected (acknowledged claims and results, the statuses read
at the end, the terminal states observed during the run, the outbox lines) and returns the
figures and the problems. Rules:

1. A record the service still shows is judged by its state: an acknowledged result must be
   recorded (not ``claimed``), and a record with an acknowledged result must end terminal
   (else it is *stuck*).
2. A record the service no longer knows was *evicted* (retention drops old tombstones) when
   there is evidence of its terminal outcome: its outbox lines, or a terminal state the run
   observed before it vanished. Without evidence it is *lost*.
3. An outbox delivery key seen more than once is *duplicated*; a receipt naming a delivery
   id the outbox does not hold is a *phantom receipt*.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

TERMINAL = frozenset({"delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"})
MAX_PROBLEMS = 40  # per report: the counts are exact, the examples are bounded


@dataclass(frozen=True)
class Seen:
    """One read of a continuation's status."""

    state: str
    cause: str | None = None  # last_error.code
    receipt_kind: str | None = None
    delivery_ids: tuple[str, ...] = ()

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Seen:
        error = body.get("lastError") or {}
        receipt = body.get("receipt") or {}
        return cls(
            state=str(body["state"]),
            cause=error.get("code"),
            receipt_kind=receipt.get("kind"),
            delivery_ids=tuple(receipt.get("deliveryIds") or ()),
        )


@dataclass
class KillReport:
    seed: int
    kills: int
    continuations: int  # acknowledged claims (including a planted one)
    acknowledged_claims: int
    acknowledged_results: int
    lost: int = 0
    duplicated: int = 0
    stuck: int = 0
    phantom_receipts: int = 0
    evicted: int = 0  # gone from the service, terminal by evidence
    evicted_evidence: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)  # final or evidenced terminal outcome
    states: dict[str, int] = field(default_factory=dict)  # states the service still shows
    delivery_unknown: dict[str, int] = field(default_factory=dict)
    dead_lettered_by_cause: dict[str, int] = field(default_factory=dict)
    outbox_lines: int = 0
    health: str = ""
    health_consistent: bool = True
    refused_start: str | None = None  # the service would not come back up
    kills_per_minute: float = 0.0
    continuations_per_kill: float = 0.0
    recovery_ms: dict[str, float] = field(default_factory=dict)
    rss_mib: dict[str, Any] = field(default_factory=dict)
    load_seconds: float = 0.0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.stuck == 0
            and self.phantom_receipts == 0
            and self.health_consistent
            and self.refused_start is None
        )

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)
        elif len(self.problems) == MAX_PROBLEMS:
            self.problems.append("(further problems left out; the counts are complete)")


@dataclass
class Outbox:
    """The outbox file read back: delivery keys are ``<continuation id>:<chunk index>``."""

    keys: Counter[str] = field(default_factory=Counter)
    chunks: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, lines: Iterable[Mapping[str, Any]]) -> Outbox:
        box = cls()
        for line in lines:
            key = str(line["deliveryKey"])
            box.keys[key] += 1
            cid, _, index = key.rpartition(":")
            box.chunks[cid].add(int(index))
            box.counts[cid] = int(line["chunkCount"])
        return box

    def lines_of(self, cid: str) -> str:
        """``all``, ``some`` or ``none`` of the continuation's chunks have their line."""
        have = self.chunks.get(cid)
        if not have:
            return "none"
        return "all" if have >= set(range(self.counts[cid])) else "some"


def judge(
    report: KillReport,
    claims: Mapping[str, str],
    results: set[str],
    final: Mapping[str, Seen | None],
    observed: Mapping[str, Seen],
    outbox: Outbox,
    stuck: Iterable[str],
) -> None:
    """Fill the report's accounting.

    ``claims`` maps task key -> continuation id of every acknowledged claim; ``final`` holds
    the status read at the end (None: the service answered 404); ``observed`` the last
    terminal status seen during the run, by continuation id; ``stuck`` the task keys still
    not terminal when the drain gave up.
    """
    report.outbox_lines = sum(outbox.keys.values())
    report.duplicated = sum(n - 1 for n in outbox.keys.values() if n > 1)
    for key, n in outbox.keys.items():
        if n > 1:
            report.problem(f"delivery {key} posted {n} times")
    stuck_keys = set(stuck)
    outcomes: Counter[str] = Counter()
    states: Counter[str] = Counter()
    evidence: Counter[str] = Counter()
    unknown: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    for key, cid in claims.items():
        st = final.get(key)
        outcome: Seen | None = None
        if st is not None:
            states[st.state] += 1
            if cid in results and st.state == "claimed":
                report.lost += 1
                report.problem(f"{key}: result acknowledged but not recorded")
            elif key in stuck_keys and cid in results:
                report.stuck += 1
                report.problem(f"{key}: result acknowledged, still {st.state} after the drain")
            if st.state in TERMINAL:
                outcome = st
        else:
            seen = observed.get(cid)
            if outbox.lines_of(cid) == "all":
                evidence["outbox_line"] += 1
                outcome = seen if seen is not None else Seen(state="delivered")
            elif seen is not None and seen.state in TERMINAL:
                evidence["observed_" + seen.state] += 1
                outcome = seen
            else:
                report.lost += 1
                what = "result acknowledged" if cid in results else "claim acknowledged"
                report.problem(f"{key}: {what}, then gone from the service without evidence")
                continue
            report.evicted += 1
        if outcome is None:
            continue
        outcomes[outcome.state] += 1
        if outcome.state == "delivery_unknown":
            unknown[outbox.lines_of(cid)] += 1
        elif outcome.state == "dead_lettered":
            causes[outcome.cause or "none"] += 1
        missing = [d for d in outcome.delivery_ids if d not in outbox.keys]
        if outcome.state == "delivered" and missing:
            report.phantom_receipts += 1
            report.problem(f"{key}: receipt names {missing[0]}, which the outbox does not hold")
    report.outcomes = dict(outcomes)
    report.states = dict(states)
    report.evicted_evidence = dict(evidence)
    report.delivery_unknown = {
        "with_outbox_line": unknown["all"],
        "partial_outbox_lines": unknown["some"],
        "without_outbox_line": unknown["none"],
    }
    report.dead_lettered_by_cause = dict(causes)


def expected_health(states: Mapping[str, int]) -> str:
    """The verdict the health endpoint should give for these (live and compacted) states."""
    if states.get("dead_lettered") or states.get("delivery_unknown"):
        return "unhealthy"
    if states.get("expired") or any(n and s not in TERMINAL for s, n in states.items()):
        return "degraded"
    return "healthy"


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max (nearest rank), rounded; empty for no values."""
    if not values:
        return {}
    ordered = sorted(values)

    def rank(p: float) -> float:
        return round(ordered[max(0, math.ceil(p * len(ordered)) - 1)], 1)

    return {"n": len(ordered), "p50": rank(0.5), "p99": rank(0.99), "max": round(ordered[-1], 1)}


def report_json(report: KillReport) -> str:
    return json.dumps({**asdict(report), "ok": report.ok}, indent=2)

"""Retention planning (pure): which terminal records to compact and which tombstones to drop.

Rules:

1. Settled outcomes (delivered, expired, cancelled, and a dead letter once an operator
   acknowledged it) are compacted into tombstones, which keep the claim identity, the
   accepted result's idempotency key and hash, the receipt, the attempts, the outcome and
   its acknowledgement, the origin context it had and any chunk receipts, and drop payload,
   text and the snapshot reference.
2. A delivered capture keeps its text while it is among the newest
   ``captured_text_max_records`` captures and younger than ``captured_text_max_age_ms``.
3. An outcome that still needs an operator (``health.attention``: an unknown delivery, an
   unacknowledged dead letter) is never compacted, and no tombstone that still carries a
   health cause (an unacknowledged expiry or delivery missing from history) is dropped:
   retention never clears a signal. Once acknowledged or resolved, every record is bounded.
4. Tombstones are kept while among the newest ``terminal_max_records`` and younger than
   ``terminal_max_age_ms``; older ones are deleted, ending their idempotency window.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from .health import cause_of, ident
from .model import Attempts, Continuation, Tombstone, TombstoneSummary

SETTLED = frozenset({"delivered", "expired", "cancelled"})


def compactable(rec: Continuation) -> bool:
    """Settled, or a dead letter an operator has acknowledged."""
    if rec.state in SETTLED:
        return True
    return rec.state == "dead_lettered" and rec.acknowledged_at_ms is not None


@dataclass(frozen=True)
class RetentionLimits:
    terminal_max_records: int
    terminal_max_age_ms: int
    captured_text_max_records: int
    captured_text_max_age_ms: int


class RetentionSettings(Protocol):
    """What the configured ``continuations.retention`` block provides (``config.Retention``)."""

    @property
    def terminal_max_records(self) -> int: ...
    @property
    def terminal_max_age_ms(self) -> int: ...
    @property
    def captured_text_max_records(self) -> int: ...
    @property
    def captured_text_max_age_ms(self) -> int: ...


def retention_limits(settings: RetentionSettings) -> RetentionLimits:
    """The planning limits of the configured retention block: the one place they are read."""
    return RetentionLimits(
        terminal_max_records=settings.terminal_max_records,
        terminal_max_age_ms=settings.terminal_max_age_ms,
        captured_text_max_records=settings.captured_text_max_records,
        captured_text_max_age_ms=settings.captured_text_max_age_ms,
    )


@dataclass
class RetentionPlan:
    compact: list[str] = field(default_factory=list)  # live ids -> tombstones
    drop: list[str] = field(default_factory=list)  # tombstone ids -> deleted

    def __bool__(self) -> bool:
        return bool(self.compact or self.drop)


def tombstone_of(rec: Continuation) -> Tombstone:
    terminal_at = rec.terminal_at_ms if rec.terminal_at_ms is not None else rec.updated_at_ms
    return Tombstone(
        claim=rec.claim,
        claim_mac=rec.claim_mac,
        state=rec.state,
        idempotency_key=rec.result.idempotency_key if rec.result else None,
        payload_hash=rec.result.payload_hash if rec.result else None,
        completion_kind=rec.completion_kind,
        receipt=rec.receipt,
        terminal_at_ms=terminal_at,
        last_error=rec.last_error,
        # Cumulative across operator retries, as the live record reports them.
        attempts=Attempts(
            synthesis=rec.attempts.synthesis,
            delivery=rec.delivery_attempts_before + rec.attempts.delivery,
        ),
        history=rec.history,
        post_unproven=rec.post_unproven or rec.state == "delivery_unknown",
        acknowledged_at_ms=rec.acknowledged_at_ms,
        origin_context=rec.origin_context,
        chunk_receipts=rec.chunk_receipts,
        task=rec.task,
    )


def plan_retention(
    live: Iterable[Continuation],
    tombs: Iterable[Tombstone | TombstoneSummary],
    now_ms: int,
    limits: RetentionLimits,
) -> RetentionPlan:
    """``tombs`` may be the tombstones or their summaries: the plan reads only what a
    :class:`~afterword.continuations.model.TombstoneSummary` carries."""
    plan = RetentionPlan()
    captures: list[Continuation] = []
    settled_now: list[Tombstone] = []
    for rec in live:
        if not compactable(rec):
            continue
        if rec.claim.mode == "capture" and rec.state == "delivered" and rec.text is not None:
            captures.append(rec)
            continue
        plan.compact.append(rec.id)
        settled_now.append(tombstone_of(rec))
    captures.sort(key=lambda r: (r.terminal_at_ms or 0, r.id), reverse=True)
    for index, rec in enumerate(captures):
        age = now_ms - (rec.terminal_at_ms or rec.updated_at_ms)
        if index >= limits.captured_text_max_records or age > limits.captured_text_max_age_ms:
            plan.compact.append(rec.id)
            settled_now.append(tombstone_of(rec))
    all_tombs: list[Tombstone | TombstoneSummary] = [*tombs, *settled_now]
    all_tombs.sort(key=lambda t: (t.terminal_at_ms, ident(t)), reverse=True)
    index = 0
    for tomb in all_tombs:
        if cause_of(tomb) is not None:
            continue  # kept (and not counted) until an operator acknowledges it
        if index >= limits.terminal_max_records or now_ms - tomb.terminal_at_ms > limits.terminal_max_age_ms:
            plan.drop.append(ident(tomb))
        index += 1
    return plan

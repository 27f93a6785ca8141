"""Delivery steps of the lifecycle: attempts, chunk receipts, outcomes, reconciliation.

Invariant 3 of :mod:`.lifecycle`: ``delivery_in_flight`` is durable before a channel is
called, so a crash after posting began is recognisable. Invariant 5: an unproven post is
never repeated without the operator's opt-in.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .errors import Conflict, InvalidTransition
from .guards import UNPROVEN_REFUSAL, may_post, move, require, terminate
from .model import MAX_DELIVERY_ATTEMPTS, Attempts, Continuation, ErrorInfo, Receipt
from .transitions import TRANSITIONS


def begin_delivery(rec: Continuation, now_ms: int) -> Continuation:
    require(rec, "begin_delivery")
    if rec.delivery_in_flight:
        raise InvalidTransition("delivery in flight", "begin_delivery")
    if not may_post(rec):
        raise Conflict(UNPROVEN_REFUSAL)
    attempts = Attempts(synthesis=rec.attempts.synthesis, delivery=rec.attempts.delivery + 1)
    return msgspec.structs.replace(
        rec, attempts=attempts, delivery_in_flight=True, next_attempt_at_ms=None, updated_at_ms=now_ms
    )


def record_chunk(rec: Continuation, delivery_id: str, now_ms: int) -> Continuation:
    """One chunk of a multi-message answer has a native receipt."""
    require(rec, "record_chunk")
    return msgspec.structs.replace(
        rec, chunk_receipts=(*rec.chunk_receipts, delivery_id), updated_at_ms=now_ms
    )


def delivered(rec: Continuation, receipt: Receipt, now_ms: int) -> Continuation:
    require(rec, "delivered")
    return terminate(rec, move(rec, "delivered"), now_ms, receipt=receipt, last_error=None)


def settle_post(rec: Continuation, receipt: Receipt, now_ms: int) -> Continuation | None:
    """The worker's confirmed post, whatever happened to the record while it was in flight.

    Normally the record is still in flight and becomes ``delivered``. Operator verbs refuse
    to act on a record in flight (:data:`.transitions.OPERATOR_REFUSALS`), so nothing else
    should have moved it; if something did anyway, the proof of the post is still kept: a
    record that may still be delivered is, and a record that ended meanwhile keeps the state
    its writer chose, with the receipt and a ``late_receipt`` error saying what happened, so
    the post is never hidden. None: the record is already delivered.
    """
    if "delivered" in TRANSITIONS[rec.state]:
        return delivered(rec, receipt, now_ms)
    if rec.state == "delivered" or not rec.terminal:
        return None  # delivered already (its own receipt stands); never reached while active
    return msgspec.structs.replace(
        rec,
        receipt=receipt,
        chunk_receipts=(),
        last_error=ErrorInfo.bounded(
            "late_receipt",
            f"the channel confirmed the post after the record became {rec.state}; receipt kept",
        ),
        acknowledged_at_ms=None,
        updated_at_ms=now_ms,
    )


def with_history(rec: Continuation, recorded: bool, error_code: str | None, now_ms: int) -> Continuation:
    """Record the outcome of the post-delivery history append (never a reason to repost)."""
    if rec.receipt is None:
        raise InvalidTransition(rec.state, "with_history")
    receipt = msgspec.structs.replace(
        rec.receipt, history_recorded=recorded, history_error_code=(error_code or None) and error_code[:64]
    )
    return msgspec.structs.replace(rec, receipt=receipt, updated_at_ms=now_ms)


def delivery_failed(
    rec: Continuation,
    *,
    retryable: bool,
    code: str,
    message: str,
    next_attempt_at_ms: int | None,
    now_ms: int,
) -> Continuation:
    """A failed attempt with a known outcome (nothing was posted for the failing chunk)."""
    require(rec, "delivery_failed")
    error = ErrorInfo.bounded(code, message)
    if not retryable:
        return terminate(rec, move(rec, "delivery_refused"), now_ms, last_error=error)
    if rec.attempts.delivery >= MAX_DELIVERY_ATTEMPTS:
        return terminate(
            rec,
            move(rec, "delivery_refused"),
            now_ms,
            last_error=ErrorInfo.bounded("retries_exhausted", f"{code}: {message}"),
        )
    return msgspec.structs.replace(
        rec,
        state=move(rec, "delivery_failed"),
        delivery_in_flight=False,
        next_attempt_at_ms=next_attempt_at_ms,
        last_error=error,
        updated_at_ms=now_ms,
    )


def delivery_unknown(rec: Continuation, code: str, message: str, now_ms: int) -> Continuation:
    require(rec, "delivery_unknown")
    return terminate(
        rec,
        move(rec, "delivery_unknown"),
        now_ms,
        last_error=ErrorInfo.bounded(code, message),
        post_unproven=True,
    )


def hold_unproven(rec: Continuation, now_ms: int) -> Continuation:
    """Park a record that would post again without the operator's opt-in (for example one a
    migration or a scheduler made due): held in ``delivery_retry`` with a visible cause."""
    require(rec, "begin_delivery")
    if may_post(rec):
        raise InvalidTransition("repost allowed", "hold_unproven")
    return msgspec.structs.replace(
        rec,
        state=move(rec, "hold_unproven"),
        delivery_in_flight=False,
        next_attempt_at_ms=None,
        last_error=ErrorInfo.bounded("repost_needs_opt_in", UNPROVEN_REFUSAL),
        post_unproven=True,
        updated_at_ms=now_ms,
    )


def reconcile(
    rec: Continuation, found: Sequence[str | None], channel_id: str | None, now_ms: int
) -> Continuation:
    """After a restart, a channel that can prove what it holds answered for each chunk of an
    interrupted delivery: its delivery id, or None when that chunk is absent.

    Every chunk present: delivered, with the receipts found. Otherwise nothing unproven is
    left (the channel holds exactly what ``found`` says and skips what it holds), so the
    delivery resumes at once; no attempt is counted, the interrupted one already was.
    """
    require(rec, "record_chunk")
    if not rec.delivery_in_flight and not rec.chunk_receipts:
        raise InvalidTransition("no interrupted delivery", "reconcile")
    if found and all(found):
        receipt = Receipt(
            kind="posted",
            delivered_at_ms=now_ms,
            channel_id=channel_id,
            delivery_ids=tuple(d for d in found if d is not None),
        )
        return terminate(
            rec, move(rec, "reconcile_found"), now_ms, receipt=receipt, last_error=None, chunk_receipts=()
        )
    held = sum(1 for d in found if d is not None)
    return msgspec.structs.replace(
        rec,
        state=move(rec, "reconcile_resume"),
        delivery_in_flight=False,
        chunk_receipts=(),
        next_attempt_at_ms=now_ms,
        last_error=ErrorInfo.bounded(
            "delivery_reconciled",
            f"interrupted delivery: the channel holds {held} of {len(found)} chunk(s); posting the rest",
        ),
        updated_at_ms=now_ms,
    )


def dead_letter(rec: Continuation, code: str, message: str, now_ms: int) -> Continuation:
    require(rec, "dead_letter")
    return terminate(rec, move(rec, "dead_letter"), now_ms, last_error=ErrorInfo.bounded(code, message))


def backoff_ms(attempt: int, jitter: float, *, base_ms: int = 1000, cap_ms: int = 300_000) -> int:
    """Exponential backoff with full jitter in [50%, 100%] of the step; ``jitter`` in [0, 1)."""
    step = min(cap_ms, base_ms * (2 ** max(0, attempt - 1)))
    return int(step * (0.5 + 0.5 * jitter))

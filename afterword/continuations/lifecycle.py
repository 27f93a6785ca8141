"""The continuation lifecycle as pure functions ``(record, ..., now_ms) -> record``.

Invariants:

1. A result is accepted once (``claimed -> result_received``); later submissions must be
   byte-identical (same idempotency key and payload hash) or they conflict.
2. Synthesis starts at most once per accepted result: ``synthesizing`` is durable before the
   model is called, and an interrupted synthesis is dead-lettered, never repeated.
3. Text is durable (``ready_to_deliver``) before any delivery attempt, and
   ``delivery_in_flight`` is durable before the channel is called, so a crash after posting
   began is recognisable and becomes ``delivery_unknown`` instead of a second post.
4. Terminal states change only through explicit operator actions.
5. Once a post began and its outcome was never proven, the record carries ``post_unproven``
   for good. Nothing posts it again (retry, recovery, migration, a scheduled attempt) unless
   an operator retried it with ``allow_unknown``; that opt-in lasts until the record is
   terminal again, so each further unproven outcome needs a fresh opt-in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from .errors import Closed, Conflict, InvalidTransition
from .health import ACKNOWLEDGEABLE, attention
from .model import (
    FALLBACK_TEXT,
    MAX_DELIVERY_ATTEMPTS,
    STATES,
    Attempts,
    CompletionKind,
    Continuation,
    ErrorInfo,
    Receipt,
    ResultRecord,
    State,
    Tombstone,
)
from .transitions import TRANSITIONS, Event

# The guards: lifecycle event -> the states it is allowed in, read off the transition table.
# Two lifecycle events stand for several table events, one per outcome.
_TABLE_EVENTS: dict[str, tuple[Event, ...]] = {
    "submit_result": ("submit_result",),
    "expire": ("expire",),
    "begin_synthesis": ("begin_synthesis",),
    "finish_synthesis": ("finish_synthesis",),
    "prepare_without_model": ("prepare_fallback", "prepare_silent"),
    "fail_synthesis": ("fail_synthesis",),
    "begin_delivery": ("begin_delivery",),
    "record_chunk": ("record_chunk",),
    "delivered": ("delivered",),
    "delivery_failed": ("delivery_failed", "delivery_refused"),
    "delivery_unknown": ("delivery_unknown",),
    "dead_letter": ("dead_letter",),
}
ALLOWED: dict[str, frozenset[str]] = {
    event: frozenset(s for s in STATES if any(e in TRANSITIONS[s] for e in table))
    for event, table in _TABLE_EVENTS.items()
}


def _require(rec: Continuation, event: str) -> None:
    if rec.state not in ALLOWED[event]:
        raise InvalidTransition(rec.state, event)


def _to(rec: Continuation, event: Event) -> State:
    """The state ``event`` leads to from ``rec``'s state, per the table."""
    state = TRANSITIONS[rec.state].get(event)
    if state is None:
        raise InvalidTransition(rec.state, event)
    return state


def _terminal(rec: Continuation, state: State, now_ms: int, **changes: object) -> Continuation:
    # A new outcome needs its own acknowledgement: an older one never hides it.
    changes.setdefault("acknowledged_at_ms", None)
    return msgspec.structs.replace(
        rec,
        state=state,
        updated_at_ms=now_ms,
        terminal_at_ms=now_ms,
        delivery_in_flight=False,
        repost_allowed=False,
        **changes,
    )


UNPROVEN_REFUSAL = (
    "an earlier post of this answer has an unknown outcome, so posting again could duplicate it: "
    "resolve it, or after checking the channel retry with --allow-unknown "
    "(HTTP allowUnknown: true, embedded allow_unknown=True)"
)


def unproven(rec: Continuation) -> bool:
    """Some post of this answer began and was never proven (sticky; see invariant 5)."""
    return rec.post_unproven or rec.state == "delivery_unknown"


def may_post(rec: Continuation) -> bool:
    """Whether a channel may be called for this record now (invariant 5)."""
    return not unproven(rec) or rec.repost_allowed


# -- results ---------------------------------------------------------------------------------
def same_result(rec: ResultRecord, idempotency_key: str, payload_hash: str) -> bool:
    return rec.idempotency_key == idempotency_key and rec.payload_hash == payload_hash


def submit_result(rec: Continuation, result: ResultRecord, now_ms: int) -> Continuation | None:
    """Accept ``result``; None when it repeats the accepted one (idempotent, no change)."""
    if rec.result is not None:
        if same_result(rec.result, result.idempotency_key, result.payload_hash):
            return None
        raise Conflict("a different result was already accepted for this continuation")
    if rec.state in ("expired", "cancelled"):
        raise Closed(f"continuation is {rec.state}")
    _require(rec, "submit_result")
    if now_ms > rec.claim.deadline_ms:
        raise Closed("the continuation's deadline has passed")
    return msgspec.structs.replace(
        rec, state=_to(rec, "submit_result"), result=result, updated_at_ms=now_ms
    )


def expire(rec: Continuation, now_ms: int) -> Continuation:
    _require(rec, "expire")
    return _terminal(
        rec, _to(rec, "expire"), now_ms, last_error=ErrorInfo.bounded("expired", "deadline passed")
    )


# -- origin settlement -----------------------------------------------------------------------
def bind_snapshot(rec: Continuation, digest: str, mac: str, now_ms: int) -> Continuation:
    if rec.origin_context != "pending":
        raise InvalidTransition(rec.origin_context, "bind_snapshot")
    return msgspec.structs.replace(rec, snapshot_digest=digest, snapshot_mac=mac, updated_at_ms=now_ms)


def activate(rec: Continuation, now_ms: int) -> Continuation:
    """The origin run committed: the bound snapshot becomes the pinned context."""
    if rec.origin_context != "pending":
        return rec
    context = "pinned" if rec.snapshot_digest is not None else "abandoned"
    return msgspec.structs.replace(rec, origin_context=context, updated_at_ms=now_ms)


def abandon(rec: Continuation, now_ms: int) -> Continuation:
    if rec.origin_context != "pending":
        return rec
    return msgspec.structs.replace(rec, origin_context="abandoned", updated_at_ms=now_ms)


# -- synthesis -------------------------------------------------------------------------------
def begin_synthesis(rec: Continuation, now_ms: int) -> Continuation:
    _require(rec, "begin_synthesis")
    if rec.deferred:
        raise InvalidTransition("pending origin", "begin_synthesis")
    attempts = Attempts(synthesis=rec.attempts.synthesis + 1, delivery=rec.attempts.delivery)
    return msgspec.structs.replace(
        rec, state=_to(rec, "begin_synthesis"), attempts=attempts, updated_at_ms=now_ms
    )


def finish_synthesis(rec: Continuation, text: str, now_ms: int) -> Continuation:
    _require(rec, "finish_synthesis")
    return msgspec.structs.replace(
        rec,
        state=_to(rec, "finish_synthesis"),
        text=text,
        completion_kind="synthesized",
        updated_at_ms=now_ms,
    )


def prepare_without_model(rec: Continuation, kind: CompletionKind, now_ms: int) -> Continuation:
    """Zero-model outcomes: the fixed fallback text, or no text (suppressed / silent)."""
    _require(rec, "prepare_without_model")
    if kind == "origin_context_unavailable":
        return msgspec.structs.replace(
            rec,
            state=_to(rec, "prepare_fallback"),
            text=FALLBACK_TEXT,
            completion_kind=kind,
            updated_at_ms=now_ms,
        )
    receipt_kind: Literal["suppressed", "silent"] = "suppressed" if kind == "suppressed" else "silent"
    receipt = Receipt(kind=receipt_kind, delivered_at_ms=now_ms)
    return _terminal(rec, _to(rec, "prepare_silent"), now_ms, completion_kind=kind, receipt=receipt)


def fail_synthesis(rec: Continuation, code: str, message: str, now_ms: int) -> Continuation:
    _require(rec, "fail_synthesis")
    return _terminal(rec, _to(rec, "fail_synthesis"), now_ms, last_error=ErrorInfo.bounded(code, message))


# -- delivery --------------------------------------------------------------------------------
def begin_delivery(rec: Continuation, now_ms: int) -> Continuation:
    _require(rec, "begin_delivery")
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
    _require(rec, "record_chunk")
    return msgspec.structs.replace(
        rec, chunk_receipts=(*rec.chunk_receipts, delivery_id), updated_at_ms=now_ms
    )


def delivered(rec: Continuation, receipt: Receipt, now_ms: int) -> Continuation:
    _require(rec, "delivered")
    return _terminal(rec, _to(rec, "delivered"), now_ms, receipt=receipt, last_error=None)


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
    _require(rec, "delivery_failed")
    error = ErrorInfo.bounded(code, message)
    if not retryable:
        return _terminal(rec, _to(rec, "delivery_refused"), now_ms, last_error=error)
    if rec.attempts.delivery >= MAX_DELIVERY_ATTEMPTS:
        return _terminal(
            rec,
            _to(rec, "delivery_refused"),
            now_ms,
            last_error=ErrorInfo.bounded("retries_exhausted", f"{code}: {message}"),
        )
    return msgspec.structs.replace(
        rec,
        state=_to(rec, "delivery_failed"),
        delivery_in_flight=False,
        next_attempt_at_ms=next_attempt_at_ms,
        last_error=error,
        updated_at_ms=now_ms,
    )


def delivery_unknown(rec: Continuation, code: str, message: str, now_ms: int) -> Continuation:
    _require(rec, "delivery_unknown")
    return _terminal(
        rec, _to(rec, "delivery_unknown"), now_ms, last_error=ErrorInfo.bounded(code, message), post_unproven=True
    )


def hold_unproven(rec: Continuation, now_ms: int) -> Continuation:
    """Park a record that would post again without the operator's opt-in (for example one a
    migration or a scheduler made due): held in ``delivery_retry`` with a visible cause."""
    _require(rec, "begin_delivery")
    if may_post(rec):
        raise InvalidTransition("repost allowed", "hold_unproven")
    return msgspec.structs.replace(
        rec,
        state=_to(rec, "hold_unproven"),
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
    _require(rec, "record_chunk")
    if not rec.delivery_in_flight and not rec.chunk_receipts:
        raise InvalidTransition("no interrupted delivery", "reconcile")
    if found and all(found):
        receipt = Receipt(
            kind="posted",
            delivered_at_ms=now_ms,
            channel_id=channel_id,
            delivery_ids=tuple(d for d in found if d is not None),
        )
        return _terminal(
            rec, _to(rec, "reconcile_found"), now_ms, receipt=receipt, last_error=None, chunk_receipts=()
        )
    held = sum(1 for d in found if d is not None)
    return msgspec.structs.replace(
        rec,
        state=_to(rec, "reconcile_resume"),
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
    _require(rec, "dead_letter")
    return _terminal(rec, _to(rec, "dead_letter"), now_ms, last_error=ErrorInfo.bounded(code, message))


# -- recovery --------------------------------------------------------------------------------
def recover(rec: Continuation, now_ms: int) -> Continuation | None:
    """After a restart: what an interrupted record becomes (None: unchanged)."""
    if "recover_synthesis" in TRANSITIONS[rec.state]:
        return _terminal(
            rec,
            _to(rec, "recover_synthesis"),
            now_ms,
            last_error=ErrorInfo.bounded("synthesis_interrupted", "the process stopped during synthesis"),
        )
    if "recover_delivery" in TRANSITIONS[rec.state] and (rec.delivery_in_flight or rec.chunk_receipts):
        return _terminal(
            rec,
            _to(rec, "recover_delivery"),
            now_ms,
            last_error=ErrorInfo.bounded(
                "delivery_interrupted", "the process stopped after posting began; outcome unknown"
            ),
            post_unproven=True,
        )
    return None


def park(rec: Continuation, code: str, message: str, now_ms: int) -> Continuation:
    """End a record that cannot be processed where an operator sees it, dropping its text
    (the bulky part) so the parked version fits. A record whose post may have begun becomes
    delivery_unknown, never a candidate for a blind repost; a terminal one keeps its state."""
    slim = msgspec.structs.replace(rec, text=None)
    error = ErrorInfo.bounded(code, message)
    if rec.terminal:
        return msgspec.structs.replace(slim, last_error=error, updated_at_ms=now_ms)
    if rec.delivery_in_flight or rec.chunk_receipts:
        return _terminal(slim, _to(rec, "park_unknown"), now_ms, last_error=error)
    return _terminal(slim, _to(rec, "park"), now_ms, last_error=error)


# -- operator actions ------------------------------------------------------------------------
def cancel(rec: Continuation, now_ms: int) -> Continuation | None:
    """Cancel active work. Idempotent for cancelled items; other terminal states are kept."""
    if rec.state == "cancelled":
        return None
    if rec.terminal:
        raise InvalidTransition(rec.state, "cancel")
    return _terminal(
        rec, _to(rec, "cancel"), now_ms, last_error=ErrorInfo.bounded("cancelled", "cancelled by operator")
    )


def retry(rec: Continuation, *, allow_unknown: bool, now_ms: int) -> Continuation:
    """Operator retry: schedule delivery (or synthesis when no text exists) now.

    A record whose post was ever unproven is refused unless ``allow_unknown`` (the unsafe
    opt-in after external verification), whichever verdict or state it reached since.
    """
    if "retry_delivery" not in TRANSITIONS[rec.state]:
        raise InvalidTransition(rec.state, "retry")
    if unproven(rec) and not allow_unknown:
        raise Conflict(UNPROVEN_REFUSAL)
    if (
        rec.state == "dead_lettered"
        and rec.last_error is not None
        and rec.last_error.code == "binding_invalid"
    ):
        raise Conflict("claim metadata failed its integrity check; it cannot be retried")
    attempts = Attempts(synthesis=rec.attempts.synthesis, delivery=0)
    if rec.text is None and rec.completion_kind is None:
        if rec.result is None:
            raise InvalidTransition(rec.state, "retry")
        state = _to(rec, "retry_synthesis")
    else:
        state = _to(rec, "retry_delivery")
    return msgspec.structs.replace(
        rec,
        state=state,
        attempts=attempts,
        delivery_in_flight=False,
        chunk_receipts=(),
        next_attempt_at_ms=now_ms,
        terminal_at_ms=None,
        receipt=None,
        acknowledged_at_ms=None,
        updated_at_ms=now_ms,
        post_unproven=unproven(rec),
        repost_allowed=unproven(rec),
    )


_RESOLVE: dict[str, Event] = {
    "delivered": "resolve_delivered",
    "not_delivered": "resolve_not_delivered",
    "dead_lettered": "resolve_dead_lettered",
}


def resolve(
    rec: Continuation,
    kind: Literal["delivered", "not_delivered", "dead_lettered"],
    delivery_id: str | None,
    now_ms: int,
) -> Continuation:
    """Operator verdict on an unknown delivery outcome."""
    event = _RESOLVE[kind]
    if event not in TRANSITIONS[rec.state]:
        raise InvalidTransition(rec.state, f"resolve {kind}")
    rec = msgspec.structs.replace(rec, post_unproven=True)  # a verdict never erases the doubt
    if kind == "delivered":
        if not delivery_id:
            raise Conflict("resolving as delivered needs the externally verified delivery id")
        receipt = Receipt(
            kind="operator",
            delivered_at_ms=now_ms,
            delivery_ids=(*rec.chunk_receipts, delivery_id)
            if delivery_id not in rec.chunk_receipts
            else rec.chunk_receipts,
        )
        return msgspec.structs.replace(
            rec,
            state=_to(rec, event),
            receipt=receipt,
            last_error=None,
            terminal_at_ms=now_ms,
            updated_at_ms=now_ms,
        )
    if kind == "not_delivered":
        # Held for an explicit operator retry: no automatic attempt is scheduled, and that
        # retry still needs allow_unknown (the verdict is the operator's word, not a proof).
        return msgspec.structs.replace(
            rec,
            state=_to(rec, event),
            delivery_in_flight=False,
            chunk_receipts=(),
            next_attempt_at_ms=None,
            terminal_at_ms=None,
            repost_allowed=False,
            last_error=ErrorInfo.bounded(
                "resolved_not_delivered",
                "operator resolved: not delivered; post it with retry --allow-unknown",
            ),
            updated_at_ms=now_ms,
        )
    # Still a dead letter that health reports until acknowledged: the verdict alone does not
    # make it eligible for compaction (it can still be retried with the unsafe opt-in).
    return msgspec.structs.replace(rec, state=_to(rec, event), terminal_at_ms=now_ms, updated_at_ms=now_ms)


def acknowledge(rec: Continuation, now_ms: int) -> Continuation | None:
    """Operator acknowledgement of a terminal outcome that affects health (dead letter,
    expiry, delivered without history). None when there is nothing (left) to acknowledge."""
    code = attention(rec)
    if code is None:
        return None  # already acknowledged, or an outcome nobody needs to act on
    if code == "delivery_unknown":
        raise Conflict("delivery outcome is unknown: resolve it as delivered, not-delivered or dead-lettered")
    if code not in ACKNOWLEDGEABLE:
        raise Conflict(f"continuation is still active ({rec.state}); nothing to acknowledge yet")
    return msgspec.structs.replace(rec, acknowledged_at_ms=now_ms, updated_at_ms=now_ms)


def acknowledge_tombstone(tomb: Tombstone, now_ms: int) -> Tombstone | None:
    """The same verdict for a compacted record (its cause survived compaction)."""
    code = attention(tomb)
    if code is None:
        return None
    if code not in ACKNOWLEDGEABLE:
        raise Conflict(f"a compacted {tomb.state} record cannot be acknowledged")
    return msgspec.structs.replace(tomb, acknowledged_at_ms=now_ms)


def backoff_ms(attempt: int, jitter: float, *, base_ms: int = 1000, cap_ms: int = 300_000) -> int:
    """Exponential backoff with full jitter in [50%, 100%] of the step; ``jitter`` in [0, 1)."""
    step = min(cap_ms, base_ms * (2 ** max(0, attempt - 1)))
    return int(step * (0.5 + 0.5 * jitter))

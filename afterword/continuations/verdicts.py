"""The operator's lifecycle actions: cancel, retry, resolve an unknown outcome, acknowledge.

Invariant 4 of :mod:`.lifecycle`: terminal states change only through these. Invariant 5 of
:mod:`.transitions`: whether a verb may act at all also depends on the record's flags (a post
in flight, chunk receipts, an unproven post); each verb asks ``require_verb`` first, so a
refusal names its reason and changes nothing.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .errors import Conflict, InvalidTransition
from .guards import move, require_verb, retry_refusal, terminate, unproven
from .health import ACKNOWLEDGEABLE, attention
from .model import Attempts, Continuation, ErrorInfo, Receipt, Tombstone
from .taskcancel import request_cancel
from .transitions import TRANSITIONS, Event, Verb


def cancel(rec: Continuation, now_ms: int) -> Continuation | None:
    """Cancel active work. Idempotent for cancelled items; other terminal states are kept."""
    if rec.state == "cancelled":
        return None
    require_verb(rec, "cancel")
    if rec.terminal:
        raise InvalidTransition(rec.state, "cancel")
    # A task-backed record's task may still run: tasks/cancel is owed, durable with the cancel.
    return request_cancel(
        terminate(
            rec,
            move(rec, "cancel"),
            now_ms,
            last_error=ErrorInfo.bounded("cancelled", "cancelled by operator"),
        )
    )


def retry(rec: Continuation, *, allow_unknown: bool, now_ms: int) -> Continuation:
    """Operator retry: schedule delivery (or synthesis when no text exists) now.

    A record whose post was ever unproven is refused unless ``allow_unknown`` (the unsafe
    opt-in after external verification), whichever verdict or state it reached since.
    """
    refused = retry_refusal(rec, allow_unknown=allow_unknown)
    if refused is not None:
        raise refused
    attempts = Attempts(synthesis=rec.attempts.synthesis, delivery=0)
    if rec.text is None and rec.completion_kind is None:
        state = move(rec, "retry_synthesis")
    else:
        state = move(rec, "retry_delivery")
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
_RESOLVE_VERB: dict[str, Verb] = {
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
    require_verb(rec, _RESOLVE_VERB[kind])
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
            state=move(rec, event),
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
            state=move(rec, event),
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
    return msgspec.structs.replace(rec, state=move(rec, event), terminal_at_ms=now_ms, updated_at_ms=now_ms)


def acknowledge(rec: Continuation, now_ms: int) -> Continuation | None:
    """Operator acknowledgement of a terminal outcome that affects health (dead letter,
    expiry, delivered without history). None when there is nothing (left) to acknowledge."""
    require_verb(rec, "acknowledge")
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

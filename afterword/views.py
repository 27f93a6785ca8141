"""Records -> wire bodies (no tokens, payloads or synthesized text ever leave here)."""

from __future__ import annotations

from .continuations.model import Continuation, ErrorInfo, Receipt, Tombstone
from .continuations.rules import format_ms
from .wire import AttemptsBody, ErrorDetail, ListItem, ReceiptBody, StatusBody


def receipt_body(r: Receipt | None) -> ReceiptBody | None:
    if r is None:
        return None
    return ReceiptBody(
        kind=r.kind,
        delivered_at=format_ms(r.delivered_at_ms),
        channel_id=r.channel_id,
        delivery_ids=r.delivery_ids,
        history_recorded=r.history_recorded,
        history_error_code=r.history_error_code,
    )


def error_body(e: ErrorInfo | None) -> ErrorDetail | None:
    return None if e is None else ErrorDetail(code=e.code, message=e.message)


def _maybe_ms(ms: int | None) -> str | None:
    return None if ms is None else format_ms(ms)


def status_body(rec: Continuation | Tombstone) -> StatusBody:
    if isinstance(rec, Tombstone):
        return StatusBody(
            continuation_id=rec.claim.id,
            state=rec.state,
            origin_context="scrubbed",
            mode=rec.claim.mode,
            kind=rec.claim.kind,
            attempts=AttemptsBody(synthesis=rec.attempts.synthesis, delivery=rec.attempts.delivery),
            last_error=error_body(rec.last_error),
            receipt=receipt_body(rec.receipt),
            completion_kind=rec.completion_kind,
            deferred=False,
            expires_at=format_ms(rec.claim.deadline_ms),
            created_at=format_ms(rec.claim.created_at_ms),
            updated_at=format_ms(rec.terminal_at_ms),
            compacted=True,
            post_unproven=rec.post_unproven,
            acknowledged_at=_maybe_ms(rec.acknowledged_at_ms),
        )
    return StatusBody(
        continuation_id=rec.id,
        state=rec.state,
        origin_context=rec.origin_context,
        mode=rec.claim.mode,
        kind=rec.claim.kind,
        attempts=AttemptsBody(synthesis=rec.attempts.synthesis, delivery=rec.attempts.delivery),
        last_error=error_body(rec.last_error),
        receipt=receipt_body(rec.receipt),
        completion_kind=rec.completion_kind,
        deferred=rec.result is not None and rec.deferred,
        expires_at=format_ms(rec.claim.deadline_ms),
        created_at=format_ms(rec.claim.created_at_ms),
        updated_at=format_ms(rec.updated_at_ms or rec.claim.created_at_ms),
        post_unproven=rec.post_unproven or rec.state == "delivery_unknown",
        acknowledged_at=_maybe_ms(rec.acknowledged_at_ms),
    )


def list_item(rec: Continuation | Tombstone) -> ListItem:
    s = status_body(rec)
    return ListItem(
        continuation_id=s.continuation_id,
        state=s.state,
        origin_context=s.origin_context,
        mode=s.mode,
        kind=s.kind,
        server_name=rec.claim.server_name,
        route=rec.claim.route,
        attempts=s.attempts,
        last_error=s.last_error,
        created_at=s.created_at,
        updated_at=s.updated_at,
        compacted=s.compacted,
        post_unproven=s.post_unproven,
    )

"""Records -> wire bodies (no tokens, payloads or synthesized text ever leave here)."""

from __future__ import annotations

from ..continuations.model import Continuation, ErrorInfo, Receipt, TaskBacking, Tombstone
from ..continuations.rules import format_ms
from ..continuations.trail import MAX_STATE_HISTORY
from ..continuations.transitions import flags
from .wire import (
    AttemptsBody,
    DetailBody,
    ErrorDetail,
    ListItem,
    ReceiptBody,
    StateChangeBody,
    StatusBody,
    TaskBody,
)

_OUTCOME = {"operator": "resolved"}


def outcome(rec: Continuation | Tombstone) -> str | None:
    """How a delivered record ended, in one word (plus "fallback " for the fixed answer)."""
    if rec.receipt is None:
        return None
    kind = _OUTCOME.get(rec.receipt.kind, rec.receipt.kind)
    return f"fallback {kind}" if rec.completion_kind == "origin_context_unavailable" else kind


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
            # The origin snapshot went with compaction: "scrubbed", as the spec names it. The
            # context the record had stays beside it (None on tombstones older than that field).
            origin_context="scrubbed",
            origin_context_at_compaction=rec.origin_context,
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
            outcome=outcome(rec),
        )
    carried = flags(rec)
    return StatusBody(
        continuation_id=rec.id,
        state=rec.state,
        origin_context=rec.origin_context,
        mode=rec.claim.mode,
        kind=rec.claim.kind,
        # Cumulative across operator retries: how many posts may have happened.
        attempts=AttemptsBody(
            synthesis=rec.attempts.synthesis,
            delivery=rec.delivery_attempts_before + rec.attempts.delivery,
        ),
        last_error=error_body(rec.last_error),
        receipt=receipt_body(rec.receipt),
        completion_kind=rec.completion_kind,
        deferred=rec.result is not None and "deferred" in carried,
        expires_at=format_ms(rec.claim.deadline_ms),
        created_at=format_ms(rec.claim.created_at_ms),
        updated_at=format_ms(rec.updated_at_ms or rec.claim.created_at_ms),
        post_unproven="unproven" in carried,
        acknowledged_at=_maybe_ms(rec.acknowledged_at_ms),
        next_attempt_at=format_ms(rec.next_attempt_at_ms)
        if rec.state == "delivery_retry" and rec.next_attempt_at_ms is not None
        else None,
        held="held" in carried,
        in_flight="in_flight" in carried,
        outcome=outcome(rec),
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
        origin_context_at_compaction=s.origin_context_at_compaction,
        post_unproven=s.post_unproven,
        next_attempt_at=s.next_attempt_at,
        held=s.held,
        outcome=s.outcome,
        acknowledged_at=s.acknowledged_at,
        in_flight=s.in_flight,
    )


def task_body(server: str, task: TaskBacking | None) -> TaskBody | None:
    if task is None:
        return None
    cancel = None
    if task.cancel_requested:
        cancel = (
            "owed" if task.cancel_sent_at_ms is None else ("failed" if task.cancel_ok is False else "sent")
        )
    return TaskBody(
        server=server,
        task_id=task.task_id,
        follow=task.follow,
        status=task.status,
        reported_at=_maybe_ms(task.reported_at_ms),
        cancel=cancel,
        cancel_detail=task.cancel_detail,
    )


def detail_body(rec: Continuation | Tombstone) -> DetailBody:
    history = [StateChangeBody(state=h.state, at=format_ms(h.at_ms), error=h.error) for h in rec.history]
    return DetailBody(
        status=status_body(rec),
        server_name=rec.claim.server_name,
        route=rec.claim.route,
        task_key=rec.claim.task_key,
        run_id=rec.claim.run_id,
        history=history,
        # Records written before histories were kept, or longer than the bound, miss entries.
        history_complete=bool(history) and len(history) < MAX_STATE_HISTORY,
        task=task_body(rec.claim.server_name, rec.task),
    )

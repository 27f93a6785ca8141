"""Legacy record -> v3 continuation (pure: keys passed in)."""

from __future__ import annotations

from datetime import datetime

from ..continuations.capabilities import claim_mac, continuation_id, fingerprint
from ..continuations.model import (
    MODES,
    STATES,
    TERMINAL,
    Claim,
    Continuation,
    ErrorInfo,
    OriginContext,
    Receipt,
    ResultRecord,
    encode,
)
from ..continuations.rules import sorted_json
from ..store import MAX_RECORD_BYTES
from .formats import LegacyRecord, MigrationError


def _ms(value: str, field: str, rid: str) -> int:
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        raise MigrationError(f"legacy record {rid!r}: {field} is not an RFC 3339 timestamp") from None


def origin_of(rec: LegacyRecord) -> OriginContext:
    if rec.kind == "detached":
        return "detached_latest"
    # No legacy format had an immutable snapshot: a record that had reached its history
    # boundary can never recover that context, so it takes the zero-model fallback.
    return "legacy_missing"


def normalize(rec: LegacyRecord, *, ids_key: bytes, mac_key: bytes) -> Continuation:
    if rec.state not in STATES:
        raise MigrationError(f"legacy record {rec.id!r}: unknown state {rec.state!r}")
    if rec.mode not in MODES:
        raise MigrationError(f"legacy record {rec.id!r}: unknown mode {rec.mode!r}")
    kind = rec.kind
    mode = rec.mode
    created = _ms(rec.created_at, "createdAt", rec.id)
    updated = _ms(rec.updated_at, "updatedAt", rec.id)
    claim = Claim(
        id=continuation_id(ids_key, kind, rec.server_name, rec.task_key),
        kind=kind,
        server_name=rec.server_name,
        run_id=None,
        conversation_id=rec.conversation_id,
        reply_to=rec.reply_to,
        route=rec.route,
        mode=mode,
        task_key=rec.task_key,
        task_hash=rec.task_hash,
        deadline_ms=_ms(rec.deadline, "deadline", rec.id),
        fingerprint=fingerprint(None, rec.server_name, rec.conversation_id, rec.reply_to, mode, rec.route),
        created_at_ms=created,
    )
    result = None
    if rec.result is not None:
        result = ResultRecord(
            idempotency_key=rec.result.idempotency_key,
            payload_hash=rec.result.payload_hash,
            payload=sorted_json(rec.result.payload),  # the form its payloadHash covers
            received_at_ms=updated,
        )
    receipt = None
    if rec.receipt is not None:
        receipt = Receipt(
            kind="posted",
            delivered_at_ms=_ms(rec.receipt.delivered_at, "receipt.deliveredAt", rec.id),
            channel_id=rec.receipt.channel_id,
            delivery_ids=tuple(rec.receipt.delivery_ids),
        )
    error = None
    if isinstance(rec.last_error, str):
        error = ErrorInfo.bounded("legacy", rec.last_error)
    elif isinstance(rec.last_error, dict):
        error = ErrorInfo.bounded(
            str(rec.last_error.get("code", "legacy")), str(rec.last_error.get("message", ""))
        )
    state = rec.state
    cont = Continuation(
        claim=claim,
        claim_mac=claim_mac(mac_key, claim),
        state=state,
        origin_context=origin_of(rec),
        result=result,
        text=rec.text,
        completion_kind="synthesized"
        if rec.text is not None and state in ("ready_to_deliver", "delivery_retry", "delivered")
        else None,
        receipt=receipt,
        last_error=error,
        # Legacy formats kept no retry schedule; a retry that was waiting is due at once (the
        # legacy update time is past), or it would wait for an operator forever.
        next_attempt_at_ms=updated if state == "delivery_retry" else None,
        updated_at_ms=updated,
        terminal_at_ms=updated if state in TERMINAL else None,
        legacy=True,
        legacy_id=rec.id,
        history_boundary=rec.history_boundary,
        # A legacy unknown outcome stays unproven through every later verdict (no repost
        # without the operator's explicit opt-in).
        post_unproven=state == "delivery_unknown",
    )
    size = len(encode(cont))
    if size > MAX_RECORD_BYTES:
        raise MigrationError(
            f"legacy record {rec.id!r}: normalized size {size} exceeds the v3 per-record limit {MAX_RECORD_BYTES}"
        )
    return cont


def merge(records: list[Continuation]) -> dict[str, Continuation]:
    """One record per v3 id; the most recently updated legacy copy wins (v2 over v1 on ties)."""
    out: dict[str, Continuation] = {}
    for rec in records:
        prev = out.get(rec.id)
        if prev is None or rec.updated_at_ms >= prev.updated_at_ms:
            out[rec.id] = rec
    return out

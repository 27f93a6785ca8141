"""The continuation lifecycle as pure functions ``(record, ..., now_ms) -> record``.

Invariants:

1. A result is accepted once (``claimed -> result_received``); later submissions must be
   byte-identical (same idempotency key and payload hash) or they conflict.
2. Synthesis starts at most once per accepted result: ``synthesizing`` is durable before the
   model is called, and an interrupted synthesis is dead-lettered, never repeated. A local
   synthesizer (no remote call, deterministic) is the exception the core allows
   (:func:`.actions.synthesis_plan`): its answer and attempt are committed in one step
   (:func:`synthesize_locally`), since nothing it did can be seen before that commit.
3. Text is durable (``ready_to_deliver``) before any delivery attempt, and
   ``delivery_in_flight`` is durable before the channel is called, so a crash after posting
   began is recognisable and becomes ``delivery_unknown`` instead of a second post.
4. Terminal states change only through explicit operator actions.
5. Once a post began and its outcome was never proven, the record carries ``post_unproven``
   for good. Nothing posts it again (retry, recovery, migration, a scheduled attempt) unless
   an operator retried it with ``allow_unknown``; that opt-in lasts until the record is
   terminal again, so each further unproven outcome needs a fresh opt-in.

The steps live in three modules and are all importable from here: results, origin settlement,
synthesis and recovery below; delivery in :mod:`.delivery`; the operator's actions in
:mod:`.verdicts`. Guards and target states come from :mod:`.transitions` through :mod:`.guards`.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .delivery import (
    backoff_ms,
    begin_delivery,
    dead_letter,
    delivered,
    delivery_failed,
    delivery_unknown,
    hold_unproven,
    reconcile,
    record_chunk,
    settle_post,
    with_history,
)
from .errors import Closed, Conflict, InvalidTransition
from .guards import ALLOWED, UNPROVEN_REFUSAL, may_post, move, require, terminate, unproven
from .model import FALLBACK_TEXT, Attempts, CompletionKind, Continuation, ErrorInfo, Receipt, ResultRecord
from .taskcancel import request_cancel
from .transitions import TRANSITIONS
from .verdicts import acknowledge, acknowledge_tombstone, cancel, resolve, retry

__all__ = [
    "ALLOWED",
    "UNPROVEN_REFUSAL",
    "abandon",
    "acknowledge",
    "acknowledge_tombstone",
    "activate",
    "backoff_ms",
    "begin_delivery",
    "begin_synthesis",
    "bind_snapshot",
    "cancel",
    "dead_letter",
    "delivered",
    "delivery_failed",
    "delivery_unknown",
    "end_after_fault",
    "expire",
    "fail_synthesis",
    "finish_synthesis",
    "hold_unproven",
    "may_post",
    "park",
    "prepare_without_model",
    "reconcile",
    "record_chunk",
    "recover",
    "resolve",
    "retry",
    "same_result",
    "settle_post",
    "submit_result",
    "synthesize_locally",
    "unproven",
    "with_history",
]


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
    require(rec, "submit_result")
    if now_ms > rec.claim.deadline_ms:
        raise Closed("the continuation's deadline has passed")
    return msgspec.structs.replace(rec, state=move(rec, "submit_result"), result=result, updated_at_ms=now_ms)


def expire(rec: Continuation, now_ms: int) -> Continuation:
    """The deadline passed with no result; a task still running is owed ``tasks/cancel``."""
    require(rec, "expire")
    return request_cancel(
        terminate(
            rec, move(rec, "expire"), now_ms, last_error=ErrorInfo.bounded("expired", "deadline passed")
        )
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
    require(rec, "begin_synthesis")
    if rec.deferred:
        raise InvalidTransition("pending origin", "begin_synthesis")
    attempts = Attempts(synthesis=rec.attempts.synthesis + 1, delivery=rec.attempts.delivery)
    return msgspec.structs.replace(
        rec, state=move(rec, "begin_synthesis"), attempts=attempts, updated_at_ms=now_ms
    )


def finish_synthesis(rec: Continuation, text: str, now_ms: int) -> Continuation:
    require(rec, "finish_synthesis")
    return msgspec.structs.replace(
        rec,
        state=move(rec, "finish_synthesis"),
        text=text,
        completion_kind="synthesized",
        updated_at_ms=now_ms,
    )


def synthesize_locally(
    rec: Continuation, text: str, now_ms: int, *, start_delivery: bool = False
) -> Continuation:
    """A local synthesizer's answer: the attempt and the text in one commit, straight from
    ``result_received`` (no durable ``synthesizing``: the run had no outside effect).
    ``start_delivery`` also marks the first delivery attempt in flight, in the same commit
    (only where :func:`.actions.answer_starts_delivery` allows it)."""
    require(rec, "synthesize_locally")
    if rec.deferred:
        raise InvalidTransition("pending origin", "synthesize_locally")
    attempts = Attempts(synthesis=rec.attempts.synthesis + 1, delivery=rec.attempts.delivery)
    ready = msgspec.structs.replace(
        rec,
        state=move(rec, "synthesize_locally"),
        attempts=attempts,
        text=text,
        completion_kind="synthesized",
        updated_at_ms=now_ms,
    )
    return begin_delivery(ready, now_ms) if start_delivery else ready


def prepare_without_model(rec: Continuation, kind: CompletionKind, now_ms: int) -> Continuation:
    """Zero-model outcomes: the fixed fallback text, or no text (suppressed / silent)."""
    require(rec, "prepare_without_model")
    if kind == "origin_context_unavailable":
        return msgspec.structs.replace(
            rec,
            state=move(rec, "prepare_fallback"),
            text=FALLBACK_TEXT,
            completion_kind=kind,
            updated_at_ms=now_ms,
        )
    receipt_kind: Literal["suppressed", "silent"] = "suppressed" if kind == "suppressed" else "silent"
    receipt = Receipt(kind=receipt_kind, delivered_at_ms=now_ms)
    return terminate(rec, move(rec, "prepare_silent"), now_ms, completion_kind=kind, receipt=receipt)


def fail_synthesis(rec: Continuation, code: str, message: str, now_ms: int) -> Continuation:
    """The synthesis failed: dead-lettered. From ``result_received`` it was a local run that
    committed no ``synthesizing``, so its attempt is counted here."""
    require(rec, "fail_synthesis")
    attempts = rec.attempts
    if rec.state == "result_received":
        attempts = Attempts(synthesis=attempts.synthesis + 1, delivery=attempts.delivery)
    return terminate(
        rec,
        move(rec, "fail_synthesis"),
        now_ms,
        attempts=attempts,
        last_error=ErrorInfo.bounded(code, message),
    )


# -- recovery --------------------------------------------------------------------------------
def recover(rec: Continuation, now_ms: int) -> Continuation | None:
    """After a restart: what an interrupted record becomes (None: unchanged)."""
    if "recover_synthesis" in TRANSITIONS[rec.state]:
        return terminate(
            rec,
            move(rec, "recover_synthesis"),
            now_ms,
            last_error=ErrorInfo.bounded("synthesis_interrupted", "the process stopped during synthesis"),
        )
    if "recover_delivery" in TRANSITIONS[rec.state] and (rec.delivery_in_flight or rec.chunk_receipts):
        return terminate(
            rec,
            move(rec, "recover_delivery"),
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
        return terminate(slim, move(rec, "park_unknown"), now_ms, last_error=error)
    return terminate(slim, move(rec, "park"), now_ms, last_error=error)


def end_after_fault(rec: Continuation, code: str, message: str, now_ms: int) -> Continuation | None:
    """A step failed in a way no rule covers (a bug, a malformed record): end the record where
    an operator sees it instead of retrying it forever. Unlike :func:`park` it keeps the text.
    A record whose post may have begun becomes delivery_unknown, never a blind repost; a
    terminal record is left as it is (None)."""
    if rec.terminal:
        return None
    if rec.delivery_in_flight or rec.chunk_receipts:
        return delivery_unknown(rec, code, message, now_ms)
    return dead_letter(rec, code, message, now_ms)

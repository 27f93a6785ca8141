"""The lifecycle state machine, driven as a table: every event in every state.

An event allowed in a state (``ALLOWED_IN`` below, written out here from the documented
lifecycle, not read from ``lifecycle.ALLOWED``) must succeed there and land in the
documented state; in every other state it must raise ``InvalidTransition`` (a ``Conflict``)
without touching the record. Operator actions, recovery and backoff have their own rules.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
from _claims import make_claim
from hypothesis import given
from hypothesis import strategies as st

from afterword.continuations import (
    FALLBACK_TEXT,
    ORIGIN_CONTEXTS,
    STATES,
    TERMINAL,
    Attempts,
    Claim,
    Closed,
    Conflict,
    Continuation,
    ErrorInfo,
    InvalidTransition,
    Receipt,
    ResultRecord,
)
from afterword.continuations import lifecycle as lc
from afterword.continuations.model import MAX_DELIVERY_ATTEMPTS

NOW = 1_900_000_000_000
DEADLINE = NOW + 3_600_000
RESULT = ResultRecord(idempotency_key="r1", payload_hash="a" * 64, payload=b"{}", received_at_ms=NOW)
RECEIPT = Receipt(kind="posted", delivered_at_ms=NOW + 5, channel_id="C1", delivery_ids=("d1",))


def claim(**changes: object) -> Claim:
    return make_claim(**{"created_at_ms": NOW - 1000, "deadline_ms": DEADLINE, **changes})  # type: ignore[arg-type]


def record(state: str = "claimed", **changes: object) -> Continuation:
    """A record in ``state`` with the fields that state implies (result, text), origin pinned."""
    fields: dict[str, object] = dict(
        claim=claim(), claim_mac="m", state=state, origin_context="pinned", updated_at_ms=NOW - 1000
    )
    if state != "claimed":
        fields["result"] = RESULT
    if state in ("ready_to_deliver", "delivery_retry", "delivered", "delivery_unknown"):
        fields["text"] = "answer"
        fields["completion_kind"] = "synthesized"
    if state in TERMINAL:
        fields["terminal_at_ms"] = NOW - 500
    fields.update(changes)
    return Continuation(**fields)  # type: ignore[arg-type]


def fresh_result() -> ResultRecord:
    return ResultRecord(idempotency_key="r2", payload_hash="b" * 64, payload=b"[]", received_at_ms=NOW)


# event -> (apply, expected state after it, when allowed)
Event = Callable[[Continuation], Continuation]
EVENTS: dict[str, tuple[Event, str | None]] = {
    # submit_result is tested on a record without an accepted result (the idempotency rule
    # comes first and has its own tests below).
    "submit_result": (
        lambda r: lc.submit_result(msgspec.structs.replace(r, result=None), fresh_result(), NOW) or r,
        "result_received",
    ),
    "expire": (lambda r: lc.expire(r, NOW), "expired"),
    "begin_synthesis": (lambda r: lc.begin_synthesis(r, NOW), "synthesizing"),
    "finish_synthesis": (lambda r: lc.finish_synthesis(r, "text", NOW), "ready_to_deliver"),
    "synthesize_locally": (lambda r: lc.synthesize_locally(r, "text", NOW), "ready_to_deliver"),
    "prepare_without_model": (
        lambda r: lc.prepare_without_model(r, "origin_context_unavailable", NOW),
        "ready_to_deliver",
    ),
    "fail_synthesis": (lambda r: lc.fail_synthesis(r, "synthesis_failed", "boom", NOW), "dead_lettered"),
    "begin_delivery": (lambda r: lc.begin_delivery(r, NOW), None),  # state unchanged
    "record_chunk": (lambda r: lc.record_chunk(r, "d9", NOW), None),
    "delivered": (lambda r: lc.delivered(r, RECEIPT, NOW), "delivered"),
    "delivery_failed": (
        lambda r: lc.delivery_failed(
            r, retryable=True, code="rate_limited", message="429", next_attempt_at_ms=NOW + 9, now_ms=NOW
        ),
        "delivery_retry",
    ),
    "delivery_unknown": (lambda r: lc.delivery_unknown(r, "timeout", "no answer", NOW), "delivery_unknown"),
    "dead_letter": (lambda r: lc.dead_letter(r, "no_channel", "none", NOW), "dead_lettered"),
}


_DELIVERING = {"ready_to_deliver", "delivery_retry"}
# event -> states it is allowed in (origin settlement is keyed on originContext, tested below).
ALLOWED_IN: dict[str, set[str]] = {
    "submit_result": {"claimed"},
    "expire": {"claimed"},
    "begin_synthesis": {"result_received"},
    "finish_synthesis": {"synthesizing"},
    "synthesize_locally": {"result_received"},
    "prepare_without_model": {"result_received", "synthesizing"},
    "fail_synthesis": {"result_received", "synthesizing"},
    "begin_delivery": _DELIVERING,
    "record_chunk": _DELIVERING,
    "delivered": _DELIVERING,
    "delivery_failed": _DELIVERING,
    "delivery_unknown": _DELIVERING,
    "dead_letter": {"claimed", "result_received", "synthesizing", *_DELIVERING},
}


def test_every_table_event_has_a_driver() -> None:
    assert set(EVENTS) == set(ALLOWED_IN) == set(lc.ALLOWED)


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("event", sorted(EVENTS))
def test_transition_table(event: str, state: str) -> None:
    apply, expected = EVENTS[event]
    rec = record(state)
    if state in ALLOWED_IN[event]:
        new = apply(rec)
        assert new.state == (expected or state)
        assert new.updated_at_ms == NOW
        assert new.claim == rec.claim  # the immutable claim never changes
        if new.state in TERMINAL:
            assert new.terminal_at_ms == NOW and not new.delivery_in_flight
    elif event == "submit_result" and state in ("expired", "cancelled"):
        with pytest.raises(Closed):
            apply(rec)
    else:
        with pytest.raises(InvalidTransition) as info:
            apply(rec)
        assert info.value.state == state and info.value.event == event
        assert info.value.status == 409


def test_terminal_states_refuse_every_worker_event() -> None:
    for state in TERMINAL:
        for event in EVENTS:
            with pytest.raises((InvalidTransition, Closed)):
                EVENTS[event][0](record(state))


# -- results ---------------------------------------------------------------------------------
def test_submit_result_accepts_once_and_repeats_idempotently() -> None:
    accepted = lc.submit_result(record("claimed"), RESULT, NOW)
    assert accepted is not None and accepted.state == "result_received" and accepted.result == RESULT
    same = ResultRecord(idempotency_key="r1", payload_hash="a" * 64, payload=b"{}", received_at_ms=NOW + 9)
    assert lc.submit_result(accepted, same, NOW + 9) is None
    # Identical resubmission stays safe in every later state, terminal ones included.
    for state in STATES:
        if state != "claimed":
            assert lc.submit_result(record(state), same, NOW) is None


@pytest.mark.parametrize(
    "other",
    [
        ResultRecord(idempotency_key="r-other", payload_hash="a" * 64, payload=b"{}", received_at_ms=NOW),
        ResultRecord(idempotency_key="r1", payload_hash="c" * 64, payload=b"[1]", received_at_ms=NOW),
    ],
)
def test_changed_result_after_acceptance_conflicts(other: ResultRecord) -> None:
    for state in STATES:
        if state == "claimed":
            continue
        with pytest.raises(Conflict):
            lc.submit_result(record(state), other, NOW)


def test_submit_result_after_deadline_is_closed() -> None:
    with pytest.raises(Closed):
        lc.submit_result(record("claimed"), RESULT, DEADLINE + 1)
    assert lc.submit_result(record("claimed"), RESULT, DEADLINE) is not None  # the deadline itself is ok


def test_result_before_origin_settles_is_deferred_and_not_synthesized() -> None:
    rec = lc.submit_result(record("claimed", origin_context="pending"), RESULT, NOW)
    assert rec is not None and rec.deferred and rec.state == "result_received"
    with pytest.raises(InvalidTransition):
        lc.begin_synthesis(rec, NOW)
    activated = lc.activate(lc.bind_snapshot(rec, "d" * 64, "mac", NOW), NOW)
    assert not activated.deferred
    assert lc.begin_synthesis(activated, NOW).attempts == Attempts(synthesis=1, delivery=0)


def test_expire_records_why() -> None:
    rec = lc.expire(record("claimed"), NOW)
    assert rec.last_error == ErrorInfo(code="expired", message="deadline passed")


# -- origin settlement -----------------------------------------------------------------------
@pytest.mark.parametrize("state", STATES)
def test_origin_settlement_is_independent_of_state(state: str) -> None:
    pending = record(state, origin_context="pending")
    bound = lc.bind_snapshot(pending, "d" * 64, "mac", NOW)
    assert (bound.snapshot_digest, bound.snapshot_mac, bound.origin_context) == ("d" * 64, "mac", "pending")
    assert lc.activate(bound, NOW).origin_context == "pinned"
    assert lc.activate(pending, NOW).origin_context == "abandoned"  # nothing was bound: no context
    assert lc.abandon(pending, NOW).origin_context == "abandoned"
    assert lc.abandon(bound, NOW).origin_context == "abandoned"
    assert lc.activate(bound, NOW).state == state == lc.abandon(bound, NOW).state


@pytest.mark.parametrize("context", [c for c in ORIGIN_CONTEXTS if c != "pending"])
def test_settled_origin_is_final(context: str) -> None:
    rec = record("claimed", origin_context=context)
    assert lc.activate(rec, NOW) is rec
    assert lc.abandon(rec, NOW) is rec
    with pytest.raises(InvalidTransition):
        lc.bind_snapshot(rec, "d" * 64, "mac", NOW)


# -- synthesis outcomes ----------------------------------------------------------------------
def test_begin_synthesis_counts_attempts() -> None:
    rec = lc.begin_synthesis(record("result_received", attempts=Attempts(synthesis=2, delivery=3)), NOW)
    assert rec.attempts == Attempts(synthesis=3, delivery=3)


def test_zero_model_outcomes() -> None:
    fallback = lc.prepare_without_model(record("result_received"), "origin_context_unavailable", NOW)
    assert (fallback.state, fallback.text, fallback.completion_kind) == (
        "ready_to_deliver",
        FALLBACK_TEXT,
        "origin_context_unavailable",
    )
    assert fallback.receipt is None
    for kind in ("silent", "suppressed"):
        done = lc.prepare_without_model(record("result_received"), kind, NOW)  # type: ignore[arg-type]
        assert done.state == "delivered" and done.completion_kind == kind and done.text is None
        assert done.receipt is not None and done.receipt.kind == kind


def test_finish_synthesis_keeps_text() -> None:
    rec = lc.finish_synthesis(record("synthesizing"), "the answer", NOW)
    assert (rec.text, rec.completion_kind) == ("the answer", "synthesized")


# -- delivery --------------------------------------------------------------------------------
def test_begin_delivery_marks_in_flight_once() -> None:
    rec = lc.begin_delivery(record("delivery_retry", next_attempt_at_ms=NOW), NOW)
    assert rec.delivery_in_flight and rec.attempts.delivery == 1 and rec.next_attempt_at_ms is None
    with pytest.raises(InvalidTransition):
        lc.begin_delivery(rec, NOW)


def test_delivered_clears_error_and_in_flight() -> None:
    rec = record("delivery_retry", delivery_in_flight=True, last_error=ErrorInfo(code="x", message="y"))
    done = lc.delivered(rec, RECEIPT, NOW)
    assert done.receipt == RECEIPT and done.last_error is None and not done.delivery_in_flight


def test_delivery_failed_permanent_and_exhausted() -> None:
    rec = record("ready_to_deliver", delivery_in_flight=True, attempts=Attempts(synthesis=1, delivery=1))
    perm = lc.delivery_failed(
        rec, retryable=False, code="channel_not_found", message="gone", next_attempt_at_ms=None, now_ms=NOW
    )
    assert perm.state == "dead_lettered" and perm.last_error is not None
    assert perm.last_error.code == "channel_not_found"
    below = msgspec.structs.replace(rec, attempts=Attempts(synthesis=1, delivery=MAX_DELIVERY_ATTEMPTS - 1))
    retry = lc.delivery_failed(
        below, retryable=True, code="rate_limited", message="", next_attempt_at_ms=NOW + 5, now_ms=NOW
    )
    assert retry.state == "delivery_retry" and retry.next_attempt_at_ms == NOW + 5
    assert not retry.delivery_in_flight
    at_cap = msgspec.structs.replace(rec, attempts=Attempts(synthesis=1, delivery=MAX_DELIVERY_ATTEMPTS))
    exhausted = lc.delivery_failed(
        at_cap, retryable=True, code="rate_limited", message="", next_attempt_at_ms=NOW + 5, now_ms=NOW
    )
    assert exhausted.state == "dead_lettered" and exhausted.last_error is not None
    assert exhausted.last_error.code == "retries_exhausted"


def test_with_history_needs_a_receipt_and_bounds_the_code() -> None:
    with pytest.raises(InvalidTransition):
        lc.with_history(record("ready_to_deliver"), False, "x", NOW)
    done = lc.delivered(record("ready_to_deliver"), RECEIPT, NOW)
    after = lc.with_history(done, False, "E" * 200, NOW)
    assert after.receipt is not None and not after.receipt.history_recorded
    assert after.receipt.history_error_code == "E" * 64
    assert after.state == "delivered"


# -- recovery --------------------------------------------------------------------------------
def test_recover_interrupted_synthesis_is_dead_lettered_never_repeated() -> None:
    rec = lc.recover(record("synthesizing"), NOW)
    assert rec is not None and rec.state == "dead_lettered"
    assert rec.last_error is not None and rec.last_error.code == "synthesis_interrupted"


@pytest.mark.parametrize("state", ["ready_to_deliver", "delivery_retry"])
def test_recover_started_delivery_becomes_unknown(state: str) -> None:
    for changes in ({"delivery_in_flight": True}, {"chunk_receipts": ("d1",)}):
        rec = lc.recover(record(state, **changes), NOW)
        assert rec is not None and rec.state == "delivery_unknown"
    assert lc.recover(record(state), NOW) is None  # nothing was posted: safe to resume


@pytest.mark.parametrize("state", [s for s in STATES if s not in ("synthesizing",)])
def test_recover_leaves_safe_states_alone(state: str) -> None:
    if state in ("ready_to_deliver", "delivery_retry"):
        return  # covered above
    assert lc.recover(record(state), NOW) is None


# -- operator actions ------------------------------------------------------------------------
@pytest.mark.parametrize("state", STATES)
def test_cancel_rules(state: str) -> None:
    rec = record(state)
    if state == "cancelled":
        assert lc.cancel(rec, NOW) is None
    elif state in TERMINAL:
        with pytest.raises(InvalidTransition):
            lc.cancel(rec, NOW)
    else:
        new = lc.cancel(rec, NOW)
        assert new is not None and new.state == "cancelled" and new.terminal_at_ms == NOW


@pytest.mark.parametrize("state", STATES)
def test_retry_is_refused_outside_failure_states(state: str) -> None:
    if state in ("dead_lettered", "delivery_retry", "delivery_unknown"):
        return
    with pytest.raises(InvalidTransition):
        lc.retry(record(state), allow_unknown=True, now_ms=NOW)


def test_retry_delivery_resets_delivery_attempts() -> None:
    rec = record(
        "dead_lettered",
        text="answer",
        completion_kind="synthesized",
        attempts=Attempts(synthesis=1, delivery=MAX_DELIVERY_ATTEMPTS),
        receipt=RECEIPT,
        last_error=ErrorInfo(code="retries_exhausted", message="x"),
    )
    new = lc.retry(rec, allow_unknown=False, now_ms=NOW)
    assert new.state == "delivery_retry" and new.next_attempt_at_ms == NOW
    assert new.attempts == Attempts(synthesis=1, delivery=0)
    assert new.terminal_at_ms is None and new.receipt is None and new.chunk_receipts == ()
    assert new.text == "answer"  # the durable text is reused, never re-synthesized


def test_retry_without_text_goes_back_to_synthesis() -> None:
    rec = record(
        "dead_lettered", text=None, completion_kind=None, last_error=ErrorInfo(code="no_channel", message="")
    )
    assert lc.retry(rec, allow_unknown=False, now_ms=NOW).state == "result_received"
    with pytest.raises(InvalidTransition):
        lc.retry(msgspec.structs.replace(rec, result=None), allow_unknown=False, now_ms=NOW)


def test_retry_of_tampered_binding_is_refused() -> None:
    rec = record("dead_lettered", last_error=ErrorInfo(code="binding_invalid", message="altered"))
    with pytest.raises(Conflict):
        lc.retry(rec, allow_unknown=True, now_ms=NOW)


def test_retry_of_unknown_delivery_needs_explicit_opt_in() -> None:
    rec = record("delivery_unknown")
    with pytest.raises(Conflict) as info:
        lc.retry(rec, allow_unknown=False, now_ms=NOW)
    assert not isinstance(info.value, InvalidTransition)
    assert lc.retry(rec, allow_unknown=True, now_ms=NOW).state == "delivery_retry"


@pytest.mark.parametrize("state", [s for s in STATES if s != "delivery_unknown"])
def test_resolve_only_from_unknown(state: str) -> None:
    for kind in ("delivered", "not_delivered", "dead_lettered"):
        with pytest.raises(InvalidTransition):
            lc.resolve(record(state), kind, "d1", NOW)  # type: ignore[arg-type]


def test_resolve_verdicts() -> None:
    unknown = record("delivery_unknown", chunk_receipts=("d1",), delivery_in_flight=False)
    with pytest.raises(Conflict):
        lc.resolve(unknown, "delivered", None, NOW)
    done = lc.resolve(unknown, "delivered", "d2", NOW)
    assert done.state == "delivered" and done.receipt is not None
    assert done.receipt.kind == "operator" and done.receipt.delivery_ids == ("d1", "d2")
    again = lc.resolve(unknown, "delivered", "d1", NOW)
    assert again.receipt is not None and again.receipt.delivery_ids == ("d1",)
    with pytest.raises(Conflict, match="chunk"):  # a receipt contradicts "not delivered"
        lc.resolve(unknown, "not_delivered", None, NOW)
    held = lc.resolve(msgspec.structs.replace(unknown, chunk_receipts=()), "not_delivered", None, NOW)
    assert held.state == "delivery_retry" and held.next_attempt_at_ms is None  # waits for an operator
    assert held.chunk_receipts == () and held.terminal_at_ms is None
    dead = lc.resolve(unknown, "dead_lettered", None, NOW)
    assert dead.state == "dead_lettered" and dead.terminal_at_ms == NOW
    assert dead.chunk_receipts == ("d1",)  # proof of the posted part is kept


# -- backoff ---------------------------------------------------------------------------------
@given(st.integers(min_value=0, max_value=200), st.floats(min_value=0, max_value=1, exclude_max=True))
def test_backoff_bounds(attempt: int, jitter: float) -> None:
    delay = lc.backoff_ms(attempt, jitter)
    step = min(300_000, 1000 * 2 ** max(0, attempt - 1))
    assert step // 2 <= delay <= step
    assert delay <= 300_000


@given(st.floats(min_value=0, max_value=1, exclude_max=True))
def test_backoff_grows_then_caps(jitter: float) -> None:
    delays = [lc.backoff_ms(n, jitter) for n in range(1, 40)]
    assert delays == sorted(delays)
    assert lc.backoff_ms(1, 0.0) == 500 and lc.backoff_ms(2, 0.0) == 1000
    assert delays[-1] == lc.backoff_ms(100, jitter)  # capped, no overflow growth

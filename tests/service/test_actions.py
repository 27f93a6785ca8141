"""continuations.actions: the transition table and next_action, against tables written here.

The expected tables below are typed out by hand from the lifecycle rules (docs/delivery.md), not
computed from the module, so a wrong entry in ``TRANSITIONS`` (or in ``next_action``) fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

import msgspec
import pytest
from _claims import make_claim

from afterword.continuations import STATES, Continuation, Receipt, ResultRecord
from afterword.continuations import lifecycle as lc
from afterword.continuations.actions import (
    TRANSITIONS,
    Action,
    Event,
    SynthesisPlan,
    after_restart,
    answer_starts_delivery,
    next_action,
    synthesis_plan,
    target,
)
from afterword.continuations.errors import InvalidTransition

NOW = 1_900_000_000_000
DEADLINE = NOW + 60_000

R, DR = "ready_to_deliver", "delivery_retry"
# (state, event) -> state after; every pair not listed must be refused.
EXPECTED: dict[tuple[str, str], str] = {
    ("claimed", "submit_result"): "result_received",
    ("claimed", "expire"): "expired",
    ("result_received", "begin_synthesis"): "synthesizing",
    ("result_received", "synthesize_locally"): R,
    ("result_received", "fail_synthesis"): "dead_lettered",
    ("result_received", "prepare_fallback"): R,
    ("result_received", "prepare_silent"): "delivered",
    ("synthesizing", "finish_synthesis"): R,
    ("synthesizing", "prepare_fallback"): R,
    ("synthesizing", "prepare_silent"): "delivered",
    ("synthesizing", "fail_synthesis"): "dead_lettered",
    ("synthesizing", "recover_synthesis"): "dead_lettered",
    ("delivery_unknown", "resolve_delivered"): "delivered",
    ("delivery_unknown", "resolve_not_delivered"): DR,
    ("delivery_unknown", "resolve_dead_lettered"): "dead_lettered",
}
for _s in ("claimed", "result_received", "synthesizing", R, DR):
    EXPECTED[(_s, "dead_letter")] = "dead_lettered"
    EXPECTED[(_s, "park")] = "dead_lettered"
    EXPECTED[(_s, "cancel")] = "cancelled"
for _s in (R, DR):
    EXPECTED[(_s, "begin_delivery")] = _s
    EXPECTED[(_s, "record_chunk")] = _s
    EXPECTED[(_s, "delivered")] = "delivered"
    EXPECTED[(_s, "delivery_failed")] = DR
    EXPECTED[(_s, "delivery_refused")] = "dead_lettered"
    EXPECTED[(_s, "delivery_unknown")] = "delivery_unknown"
    EXPECTED[(_s, "hold_unproven")] = DR
    EXPECTED[(_s, "reconcile_found")] = "delivered"
    EXPECTED[(_s, "reconcile_resume")] = DR
    EXPECTED[(_s, "recover_delivery")] = "delivery_unknown"
    EXPECTED[(_s, "park_unknown")] = "delivery_unknown"
for _s in ("dead_lettered", DR, "delivery_unknown"):
    EXPECTED[(_s, "retry_delivery")] = DR
    EXPECTED[(_s, "retry_synthesis")] = "result_received"

EVENTS: tuple[str, ...] = get_args(Event)


@pytest.mark.parametrize("state", STATES)
def test_transition_table_row(state: str) -> None:
    for event in EVENTS:
        assert target(state, event) == EXPECTED.get((state, event)), (state, event)  # type: ignore[arg-type]
    assert set(TRANSITIONS[state]) <= set(EVENTS)  # type: ignore[index]


def test_terminal_states_leave_only_through_operator_events() -> None:
    operator = {
        "retry_delivery",
        "retry_synthesis",
        "resolve_delivered",
        "resolve_not_delivered",
        "resolve_dead_lettered",
    }
    for state in ("delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"):
        assert set(TRANSITIONS[state]) <= operator, state  # type: ignore[index]


# lifecycle.ALLOWED event -> the table events it stands for (split by outcome here).
SPLIT = {
    "prepare_without_model": ("prepare_fallback", "prepare_silent"),
    "delivery_failed": ("delivery_failed", "delivery_refused"),
}


def test_lifecycle_guard_agrees_with_the_table() -> None:
    for event, states in lc.ALLOWED.items():
        table_states = {s for s in STATES for e in SPLIT.get(event, (event,)) if target(s, e) is not None}  # type: ignore[arg-type]
        assert states == table_states, event


# -- the lifecycle functions land where the table says -------------------------------------
RESULT = ResultRecord(idempotency_key="r1", payload_hash="a" * 64, payload=b"{}", received_at_ms=NOW)
RECEIPT = Receipt(kind="posted", delivered_at_ms=NOW, channel_id="C1", delivery_ids=("d1",))


def record(state: str, **changes: object) -> Continuation:
    claim = make_claim(created_at_ms=NOW - 1000, deadline_ms=DEADLINE)
    fields: dict[str, object] = dict(
        claim=claim, claim_mac="m", state=state, origin_context="pinned", updated_at_ms=NOW - 1000
    )
    if state != "claimed":
        fields["result"] = RESULT
    if state in (R, DR, "delivered", "delivery_unknown"):
        fields["text"] = "answer"
        fields["completion_kind"] = "synthesized"
    fields.update(changes)
    return Continuation(**fields)  # type: ignore[arg-type]


DRIVERS: dict[str, Callable[[Continuation], Continuation | None]] = {
    "submit_result": lambda r: lc.submit_result(r, RESULT, NOW),
    "expire": lambda r: lc.expire(r, NOW),
    "begin_synthesis": lambda r: lc.begin_synthesis(r, NOW),
    "finish_synthesis": lambda r: lc.finish_synthesis(r, "t", NOW),
    "synthesize_locally": lambda r: lc.synthesize_locally(r, "t", NOW),
    "prepare_fallback": lambda r: lc.prepare_without_model(r, "origin_context_unavailable", NOW),
    "prepare_silent": lambda r: lc.prepare_without_model(r, "silent", NOW),
    "fail_synthesis": lambda r: lc.fail_synthesis(r, "x", "y", NOW),
    "begin_delivery": lambda r: lc.begin_delivery(r, NOW),
    "record_chunk": lambda r: lc.record_chunk(r, "d1", NOW),
    "delivered": lambda r: lc.delivered(r, RECEIPT, NOW),
    "delivery_failed": lambda r: lc.delivery_failed(
        r, retryable=True, code="x", message="y", next_attempt_at_ms=NOW + 5, now_ms=NOW
    ),
    "delivery_refused": lambda r: lc.delivery_failed(
        r, retryable=False, code="x", message="y", next_attempt_at_ms=None, now_ms=NOW
    ),
    "delivery_unknown": lambda r: lc.delivery_unknown(r, "x", "y", NOW),
    "hold_unproven": lambda r: lc.hold_unproven(msgspec.structs.replace(r, post_unproven=True), NOW),
    "reconcile_found": lambda r: lc.reconcile(
        msgspec.structs.replace(r, delivery_in_flight=True), ["d1"], "C", NOW
    ),
    "reconcile_resume": lambda r: lc.reconcile(
        msgspec.structs.replace(r, delivery_in_flight=True), [None], "C", NOW
    ),
    "dead_letter": lambda r: lc.dead_letter(r, "x", "y", NOW),
    "park": lambda r: lc.park(r, "x", "y", NOW),
    "park_unknown": lambda r: lc.park(msgspec.structs.replace(r, delivery_in_flight=True), "x", "y", NOW),
    "recover_synthesis": lambda r: lc.recover(r, NOW),
    "recover_delivery": lambda r: lc.recover(msgspec.structs.replace(r, delivery_in_flight=True), NOW),
    "cancel": lambda r: lc.cancel(r, NOW),
    "retry_delivery": lambda r: lc.retry(
        msgspec.structs.replace(r, text="answer", completion_kind="synthesized"),
        allow_unknown=True,
        now_ms=NOW,
    ),
    "retry_synthesis": lambda r: lc.retry(
        msgspec.structs.replace(r, text=None, completion_kind=None), allow_unknown=True, now_ms=NOW
    ),
    "resolve_delivered": lambda r: lc.resolve(r, "delivered", "d1", NOW),
    "resolve_not_delivered": lambda r: lc.resolve(r, "not_delivered", None, NOW),
    "resolve_dead_lettered": lambda r: lc.resolve(r, "dead_lettered", None, NOW),
}


def test_every_table_event_has_a_driver() -> None:
    assert set(DRIVERS) == set(EVENTS)


@pytest.mark.parametrize(("state", "event"), sorted(EXPECTED))
def test_lifecycle_function_lands_on_the_table_target(state: str, event: str) -> None:
    new = DRIVERS[event](record(state))
    assert new is not None and new.state == EXPECTED[(state, event)]


# -- next_action -----------------------------------------------------------------------------
WAIT_RETRY = Action(kind="wait", at_ms=NOW + 10)
NEXT: list[tuple[str, dict[str, object], int, Action]] = [
    ("claimed", {}, NOW, Action(kind="wait", at_ms=DEADLINE + 1)),
    ("claimed", {}, DEADLINE, Action(kind="wait", at_ms=DEADLINE + 1)),
    ("claimed", {}, DEADLINE + 1, Action(kind="expire")),
    ("result_received", {}, NOW, Action(kind="synthesize")),
    ("result_received", {"origin_context": "pending"}, NOW, Action(kind="none")),
    ("synthesizing", {}, NOW, Action(kind="none")),
    (R, {}, NOW, Action(kind="deliver")),
    (R, {"delivery_in_flight": True}, NOW, Action(kind="none")),
    (R, {"post_unproven": True}, NOW, Action(kind="hold")),
    (R, {"post_unproven": True, "repost_allowed": True}, NOW, Action(kind="deliver")),
    (DR, {"next_attempt_at_ms": NOW + 10}, NOW, WAIT_RETRY),
    (DR, {"next_attempt_at_ms": NOW + 10}, NOW + 10, Action(kind="deliver")),
    (DR, {"next_attempt_at_ms": NOW}, NOW + 99, Action(kind="deliver")),
    (DR, {"next_attempt_at_ms": None}, NOW, Action(kind="none")),
    (DR, {"next_attempt_at_ms": NOW, "delivery_in_flight": True}, NOW, Action(kind="none")),
    (DR, {"next_attempt_at_ms": NOW, "post_unproven": True}, NOW, Action(kind="hold")),
    ("delivered", {}, NOW, Action(kind="none")),
    ("delivery_unknown", {}, NOW, Action(kind="none")),
    ("expired", {}, NOW, Action(kind="none")),
    ("cancelled", {}, NOW, Action(kind="none")),
    ("dead_lettered", {}, NOW, Action(kind="none")),
]


@pytest.mark.parametrize(("state", "changes", "now", "expected"), NEXT)
def test_next_action(state: str, changes: dict[str, object], now: int, expected: Action) -> None:
    assert next_action(record(state, **changes), now) == expected


def test_next_action_covers_every_state() -> None:
    assert {row[0] for row in NEXT} == set(STATES)


@pytest.mark.parametrize(("state", "changes", "now", "expected"), NEXT)
def test_worker_asks_next_action(state: str, changes: dict[str, object], now: int, expected: Action) -> None:
    from afterword.worker.loop import Worker

    acts = {"expire", "synthesize", "deliver", "hold"}
    want = expected.kind if expected.kind in acts else None
    assert Worker._action(None, record(state, **changes), now) == want  # type: ignore[arg-type]


# -- after_restart: what startup recovery makes of a record, decided by the core -------------
# (state, origin_context, in the activation marker?, delivery in flight) ->
# (state after, origin_context after, last error code after). Records carry a bound snapshot
# digest unless the origin is "pending-nodigest" (listed, but finalize never bound one).
RESTART_CASES = [
    ("claimed", "pending", True, False, "claimed", "pinned", None),
    ("claimed", "pending-nodigest", True, False, "claimed", "abandoned", None),
    ("claimed", "pending", False, False, "claimed", "abandoned", None),
    ("claimed", "pending", None, False, "claimed", "abandoned", None),
    ("claimed", "pinned", None, False, "claimed", "pinned", None),
    ("synthesizing", "pinned", None, False, "dead_lettered", "pinned", "synthesis_interrupted"),
    (R, "pinned", None, True, "delivery_unknown", "pinned", "delivery_interrupted"),
    (R, "pinned", None, False, R, "pinned", None),
    (DR, "pinned", None, True, "delivery_unknown", "pinned", "delivery_interrupted"),
    ("delivered", "pinned", None, False, "delivered", "pinned", None),
]


@pytest.mark.parametrize(
    ("state", "origin", "listed", "in_flight", "want_state", "want_origin", "want_error"), RESTART_CASES
)
def test_restart_ends_interrupted_work_and_abandons_unlisted_pending_origins(
    state: str,
    origin: str,
    listed: bool | None,
    in_flight: bool,
    want_state: str,
    want_origin: str,
    want_error: str | None,
) -> None:
    digest = None if origin == "pending-nodigest" else "b" * 64
    rec = record(
        state, origin_context=origin.split("-")[0], delivery_in_flight=in_flight, snapshot_digest=digest
    )
    marker = None if listed is None else ({rec.id} if listed else {"c_other"})
    after = after_restart(rec, marker, NOW)
    assert (after.state, after.origin_context) == (want_state, want_origin)
    assert (after.last_error.code if after.last_error else None) == want_error
    if after == rec:
        assert after is rec  # unchanged records are not rewritten


def test_after_restart_leaves_detached_origins_alone() -> None:
    rec = record("claimed", origin_context="detached_latest")
    rec = msgspec.structs.replace(rec, claim=msgspec.structs.replace(rec.claim, kind="detached", run_id=None))
    assert after_restart(rec, None, NOW) is rec


# -- end_after_fault: a step failed unexpectedly; the core decides how the record ends ---------
@pytest.mark.parametrize(
    ("state", "changes", "expected"),
    [
        ("claimed", {}, "dead_lettered"),
        ("result_received", {}, "dead_lettered"),
        ("synthesizing", {}, "dead_lettered"),
        (R, {}, "dead_lettered"),
        (R, {"delivery_in_flight": True}, "delivery_unknown"),
        (DR, {"chunk_receipts": ("d0",)}, "delivery_unknown"),
        ("delivered", {}, None),
        ("cancelled", {}, None),
    ],
)
def test_end_after_fault(state: str, changes: dict[str, object], expected: str | None) -> None:
    rec = record(state, **changes)
    after = lc.end_after_fault(rec, "internal_error", "KeyError", NOW)
    if expected is None:
        assert after is None
        return
    assert after is not None and after.state == expected
    assert after.last_error is not None and after.last_error.code == "internal_error"
    assert after.text == rec.text  # unlike park, the answer is kept


# -- synthesis_plan: which commits one synthesis takes, by where the synthesizer runs ---------
# local -> (committed before the call, committed with the answer, committed on interruption)
PLANS = [
    (False, "begin_synthesis", "finish_synthesis", "fail_synthesis"),
    (True, None, "synthesize_locally", None),
]


@pytest.mark.parametrize(("local", "start", "finish", "interrupted"), PLANS)
def test_synthesis_plan(local: bool, start: str | None, finish: str, interrupted: str | None) -> None:
    assert synthesis_plan(local) == SynthesisPlan(start=start, finish=finish, interrupted=interrupted)  # type: ignore[arg-type]


def _run_plan(local: bool, outcome: str) -> list[Continuation]:
    """The committed versions of one synthesis of a ``result_received`` record, the first
    being the record itself: outcome "text", "failed" or "interrupted" (a stop mid-call)."""
    plan = synthesis_plan(local)
    versions = [record("result_received")]
    if plan.start is not None:
        versions.append(lc.begin_synthesis(versions[-1], NOW))
    if outcome == "text":
        finish = lc.synthesize_locally if plan.finish == "synthesize_locally" else lc.finish_synthesis
        versions.append(finish(versions[-1], "answer", NOW))
    elif outcome == "failed":
        versions.append(lc.fail_synthesis(versions[-1], "synthesis_failed", "E", NOW))
    elif plan.interrupted is not None:
        versions.append(lc.fail_synthesis(versions[-1], "synthesis_interrupted", "stopped", NOW))
    return versions


# (local, outcome) -> the states committed after result_received, and the synthesis attempts
# the last version counts.
COMMITS = [
    (False, "text", ["synthesizing", R], 1),
    (False, "failed", ["synthesizing", "dead_lettered"], 1),
    (False, "interrupted", ["synthesizing", "dead_lettered"], 1),
    (True, "text", [R], 1),
    (True, "failed", ["dead_lettered"], 1),
    (True, "interrupted", [], 0),
]


@pytest.mark.parametrize(("local", "outcome", "states", "attempts"), COMMITS)
def test_synthesis_commits(local: bool, outcome: str, states: list[str], attempts: int) -> None:
    versions = _run_plan(local, outcome)
    assert [v.state for v in versions[1:]] == states
    assert versions[-1].attempts.synthesis == attempts
    if versions[-1].state == R:
        assert (versions[-1].text, versions[-1].completion_kind) == ("answer", "synthesized")


# A crash after each commit of a synthesis: (local, versions committed, including the first)
# -> what startup recovery makes of it, and the next action. A remote synthesis that began is
# never run again; a local one that never committed is simply run again.
CRASHES = [
    (False, 1, "result_received", "synthesize"),
    (False, 2, "dead_lettered", "none"),
    (False, 3, R, "deliver"),
    (True, 1, "result_received", "synthesize"),
    (True, 2, R, "deliver"),
]


@pytest.mark.parametrize(("local", "committed", "state", "action"), CRASHES)
def test_a_crash_between_synthesis_commits(local: bool, committed: int, state: str, action: str) -> None:
    versions = _run_plan(local, "text")
    after = after_restart(versions[committed - 1], None, NOW)
    assert after.state == state
    assert next_action(after, NOW).kind == action
    if state == "dead_lettered":
        assert after.last_error is not None and after.last_error.code == "synthesis_interrupted"


def test_a_local_synthesis_is_refused_while_the_origin_is_pending() -> None:
    with pytest.raises(InvalidTransition):
        lc.synthesize_locally(record("result_received", origin_context="pending"), "answer", NOW)


# -- answer_starts_delivery: a local answer and the delivery's in-flight mark in one commit -----
# (channel reconciles, state, mode, changes) -> one commit?
FOLDS = [
    (True, "result_received", "reply", {}, True),
    (True, "result_received", "notify_if_actionable", {}, True),
    (False, "result_received", "reply", {}, False),  # a crash in flight would need an operator
    (True, "result_received", "capture", {}, False),  # nothing is posted
    (True, "result_received", "reply", {"origin_context": "pending"}, False),
    (True, "result_received", "reply", {"post_unproven": True}, False),  # held for the operator
    (True, "result_received", "reply", {"post_unproven": True, "repost_allowed": True}, True),
    (True, "synthesizing", "reply", {}, False),
    (True, R, "reply", {}, False),
]


@pytest.mark.parametrize(("reconciles", "state", "mode", "changes", "expected"), FOLDS)
def test_answer_starts_delivery(
    reconciles: bool, state: str, mode: str, changes: dict[str, object], expected: bool
) -> None:
    rec = record(state, **changes)
    rec = msgspec.structs.replace(rec, claim=msgspec.structs.replace(rec.claim, mode=mode))
    assert answer_starts_delivery(rec, channel_reconciles=reconciles) is expected


def test_the_one_commit_is_the_two_commits_it_replaces() -> None:
    """Folded, the record is exactly what the answer's commit followed by the in-flight commit
    would leave, so a crash after it is recovered (reconciled) the same way."""
    rec = record("result_received")
    folded = lc.synthesize_locally(rec, "answer", NOW, start_delivery=True)
    assert folded == lc.begin_delivery(lc.synthesize_locally(rec, "answer", NOW), NOW)
    assert (folded.state, folded.delivery_in_flight, folded.attempts.delivery) == (R, True, 1)
    assert next_action(folded, NOW).kind == "none"  # in flight: nothing else may post it
    after = after_restart(folded, None, NOW)  # without reconciliation: unknown, never reposted
    assert after.state == "delivery_unknown"

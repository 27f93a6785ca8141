"""Health is a pure function of the current records; every cause names ids and a command."""

from __future__ import annotations

import msgspec
import pytest
from _claims import make_claim

from afterword.continuations import lifecycle as lc
from afterword.continuations.errors import Conflict
from afterword.continuations.health import assess, attention, clearing_command
from afterword.continuations.model import Continuation, Receipt, Tombstone
from afterword.continuations.retention import RetentionLimits, plan_retention, tombstone_of

NOW = 1_900_000_000_000
DAY = 24 * 3600 * 1000
LIMITS = RetentionLimits(
    terminal_max_records=10,
    terminal_max_age_ms=DAY,
    captured_text_max_records=10,
    captured_text_max_age_ms=DAY,
)


def rec(cid: str, state: str = "claimed", **changes: object) -> Continuation:
    claim = make_claim(id=cid, created_at_ms=NOW - DAY, deadline_ms=NOW + DAY)
    fields: dict[str, object] = dict(claim=claim, claim_mac="m", state=state, updated_at_ms=NOW - DAY)
    if state in ("delivered", "dead_lettered", "expired", "cancelled", "delivery_unknown"):
        fields["terminal_at_ms"] = NOW - DAY
    fields.update(changes)
    return Continuation(**fields)  # type: ignore[arg-type]


UNRECORDED = Receipt(
    kind="posted", delivered_at_ms=NOW - DAY, history_recorded=False, history_error_code="io"
)


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], "healthy"),
        (
            [rec("a", "delivered", receipt=Receipt(kind="posted", delivered_at_ms=1)), rec("b", "cancelled")],
            "healthy",
        ),
        ([rec("a", "delivered", receipt=UNRECORDED)], "degraded"),
        ([rec("a", "claimed")], "degraded"),
        ([rec("a", "delivery_retry", next_attempt_at_ms=5)], "degraded"),
        ([rec("a", "expired")], "degraded"),
        ([rec("a", "dead_lettered"), rec("b", "claimed")], "unhealthy"),
        ([rec("a", "delivery_unknown", receipt=UNRECORDED)], "unhealthy"),
        ([rec("a", "dead_lettered", acknowledged_at_ms=NOW)], "healthy"),
        ([rec("a", "expired", acknowledged_at_ms=NOW)], "healthy"),
        ([rec("a", "delivered", receipt=UNRECORDED, acknowledged_at_ms=NOW)], "healthy"),
    ],
)
def test_status_from_records(records: list[Continuation], expected: str) -> None:
    assert assess(records, ()).status == expected


def test_every_cause_names_its_ids_and_the_clearing_command() -> None:
    records = [
        rec("d2", "dead_lettered"),
        rec("d1", "dead_lettered"),
        rec("u", "delivery_unknown"),
        rec("e", "expired"),
        rec("h", "delivery_retry", next_attempt_at_ms=None),
        rec("p", "result_received"),
    ]
    tombs = [tombstone_of(rec("x", "delivered", receipt=UNRECORDED))]
    report = assess(records, tombs)
    by_code = {c.code: c for c in report.causes}
    assert set(by_code) == {
        "dead_lettered",
        "delivery_unknown",
        "expired",
        "history_unrecorded",
        "held",
        "pending",
    }
    assert by_code["dead_lettered"].ids == ("d1", "d2") and by_code["dead_lettered"].status == "unhealthy"
    assert by_code["dead_lettered"].commands == (
        "afterword continuations acknowledge d1",
        "afterword continuations acknowledge d2",
    )
    assert by_code["history_unrecorded"].ids == ("x",)  # a compacted record keeps its cause
    assert by_code["delivery_unknown"].commands[0].startswith("afterword continuations resolve u ")
    held = assess([rec("h", "delivery_retry", next_attempt_at_ms=None)], (), config_path="/etc/a w.json")
    assert held.causes[0].commands == ("afterword continuations retry --config '/etc/a w.json' h",)
    unproven = assess([rec("h", "delivery_retry", next_attempt_at_ms=None, post_unproven=True)], ())
    assert unproven.causes[0].commands == ("afterword continuations retry h --allow-unknown",)
    assert report.history_unrecorded == 1 and report.active == 2
    assert report.counts == {
        "dead_lettered": 2,
        "delivery_unknown": 1,
        "expired": 1,
        "delivery_retry": 1,
        "result_received": 1,
        "delivered": 1,
    }


def test_ids_are_bounded_but_counts_exact() -> None:
    report = assess([rec(f"c{i:03d}", "expired") for i in range(250)], (), id_limit=100)
    (cause,) = report.causes
    assert cause.count == 250 and len(cause.ids) == 100 and cause.ids[0] == "c000"


def test_acknowledge_rules() -> None:
    dead = rec("a", "dead_lettered")
    acked = lc.acknowledge(dead, NOW)
    assert acked is not None and acked.acknowledged_at_ms == NOW and attention(acked) is None
    assert lc.acknowledge(acked, NOW + 1) is None  # idempotent
    assert (
        lc.acknowledge(rec("b", "delivered", receipt=Receipt(kind="posted", delivered_at_ms=1)), NOW) is None
    )
    with pytest.raises(Conflict, match="resolve"):
        lc.acknowledge(rec("c", "delivery_unknown"), NOW)
    with pytest.raises(Conflict, match="active"):
        lc.acknowledge(rec("d", "result_received"), NOW)
    # A retry, and any later terminal outcome, needs a fresh acknowledgement.
    retried = lc.retry(
        msgspec.structs.replace(acked, completion_kind="synthesized", text="t"),
        allow_unknown=False,
        now_ms=NOW,
    )
    assert retried.acknowledged_at_ms is None
    again = lc.delivery_failed(
        lc.begin_delivery(retried, NOW),
        retryable=False,
        code="x",
        message="y",
        next_attempt_at_ms=None,
        now_ms=NOW,
    )
    assert again.state == "dead_lettered" and attention(again) == "dead_lettered"
    # Resolving an unknown delivery as dead-lettered leaves a dead letter to acknowledge.
    resolved = lc.resolve(rec("u", "delivery_unknown"), "dead_lettered", None, NOW)
    assert attention(resolved) == "dead_lettered"
    tomb = tombstone_of(rec("e", "expired"))
    acked_tomb = lc.acknowledge_tombstone(tomb, NOW)
    assert acked_tomb is not None and attention(acked_tomb) is None
    assert lc.acknowledge_tombstone(acked_tomb, NOW) is None


def test_retention_bounds_every_record_once_nobody_needs_to_act() -> None:
    old = NOW - 2 * DAY
    live = [
        rec("dead", "dead_lettered", terminal_at_ms=old),
        rec("dead-acked", "dead_lettered", terminal_at_ms=old, acknowledged_at_ms=old),
        rec("unknown", "delivery_unknown", terminal_at_ms=old),
    ]
    tombs: list[Tombstone] = [
        tombstone_of(rec("exp", "expired", terminal_at_ms=old)),
        tombstone_of(rec("exp-acked", "expired", terminal_at_ms=old, acknowledged_at_ms=old)),
        tombstone_of(rec("unrec", "delivered", receipt=UNRECORDED, terminal_at_ms=old)),
    ]
    plan = plan_retention(live, tombs, NOW, LIMITS)
    assert plan.compact == ["dead-acked"]
    # past the age bound: acknowledged records go; ones still carrying a cause stay
    assert sorted(plan.drop) == ["dead-acked", "exp-acked"]


def test_clearing_command_quotes_ids() -> None:
    assert clearing_command("expired", "a b") == "afterword continuations acknowledge 'a b'"


def test_a_dead_letter_that_cannot_be_retried_is_never_told_to_retry() -> None:
    # Task dead letters (lost, input required, host gone, protocol error, too large) carry no
    # answer to post: the core refuses their retry, so health's words must not offer one.
    from afterword.continuations.model import ErrorInfo

    lost = [
        rec(f"t{i}", "dead_lettered", last_error=ErrorInfo(code=code, message="m"))
        for i, code in enumerate(("task_input_required", "task_host_gone", "task_protocol_error"))
    ]
    cause = assess(lost, ()).causes[0]
    assert cause.code == "dead_lettered"
    assert all(c.startswith("afterword continuations acknowledge ") for c in cause.commands)
    assert "retry" not in cause.message.replace("cannot be retried", "")
    retryable = rec("r", "dead_lettered", text="the answer")
    mixed = assess([*lost, retryable], ()).causes[0]
    assert "afterword continuations retry r" in mixed.commands
    assert "acknowledge" in mixed.message and "retry" in mixed.message
    alone = assess([retryable], ()).causes[0]
    assert alone.commands == ("afterword continuations retry r",) and "retry it" in alone.message

"""The kill test: its verdict rules on made-up evidence, a bounded SIGKILL smoke run, planted losses.

The 1,000-kill soak runs only when AFTERWORD_KILLTEST_SOAK is set (``1`` for the published
soak, or a number of kills); see docs/crash-testing.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.killtest import run_killtest
from tools.killtest.__main__ import SOAK
from tools.killtest.run import PLANT_KEY
from tools.killtest.verdict import KillReport, Outbox, Seen, expected_health, judge, percentiles


def _report(n: int) -> KillReport:
    return KillReport(seed=0, kills=1, continuations=n, acknowledged_claims=n, acknowledged_results=n)


def _line(cid: str, index: int = 0, count: int = 1) -> dict[str, Any]:
    return {"deliveryKey": f"{cid}:{index}", "chunkCount": count}


def _posted(*ids: str) -> Seen:
    return Seen(state="delivered", receipt_kind="posted", delivery_ids=ids)


def _judge(
    final: dict[str, Seen | None],
    lines: list[dict[str, Any]],
    observed: dict[str, Seen] | None = None,
    results: set[str] | None = None,
    stuck: tuple[str, ...] = (),
) -> KillReport:
    claims = {key: "c-" + key for key in final}
    report = _report(len(claims))
    judge(
        report,
        claims,
        set(claims.values()) if results is None else results,
        final,
        observed or {},
        Outbox.of(lines),
        stuck,
    )
    return report


def test_a_record_evicted_with_its_outbox_line_is_terminal_not_lost() -> None:
    report = _judge({"a": _posted("c-a:0"), "b": None}, [_line("c-a"), _line("c-b")])
    assert (report.lost, report.evicted, report.evicted_evidence) == (0, 1, {"outbox_line": 1})
    assert report.outcomes == {"delivered": 2}
    assert report.ok


def test_a_record_evicted_after_an_observed_dead_letter_is_terminal() -> None:
    seen = Seen(state="dead_lettered", cause="synthesis_interrupted")
    report = _judge({"a": None}, [], observed={"c-a": seen})
    assert (report.lost, report.evicted, report.evicted_evidence) == (0, 1, {"observed_dead_lettered": 1})
    assert report.dead_lettered_by_cause == {"synthesis_interrupted": 1}


def test_a_record_that_vanished_without_evidence_is_lost() -> None:
    # a missing chunk is no evidence; neither is a non-terminal state observed earlier
    report = _judge(
        {"a": None, "b": None, "c": None},
        [_line("c-b", 0, 2)],
        observed={"c-c": Seen(state="ready_to_deliver")},
    )
    assert (report.lost, report.evicted) == (3, 0)
    assert not report.ok
    assert "a: result acknowledged, then gone from the service without evidence" in report.problems


def test_a_claim_without_result_that_vanished_is_lost() -> None:
    report = _judge({"a": None}, [], results=set())
    assert report.lost == 1 and report.problems == [
        "a: claim acknowledged, then gone from the service without evidence"
    ]


def test_unknown_deliveries_are_split_by_their_outbox_lines() -> None:
    unknown = Seen(state="delivery_unknown")
    report = _judge(
        {"a": unknown, "b": unknown, "c": unknown, "d": None},
        [_line("c-a"), _line("c-b", 0, 2)],
        observed={"c-d": unknown},
    )
    assert report.delivery_unknown == {
        "with_outbox_line": 1,
        "partial_outbox_lines": 1,
        "without_outbox_line": 2,
    }
    assert report.outcomes == {"delivery_unknown": 4} and report.evicted == 1
    assert report.states == {"delivery_unknown": 3}


def test_duplicates_phantom_receipts_unrecorded_results_and_stuck_records_fail() -> None:
    report = _judge(
        {
            "a": _posted("c-a:0"),
            "b": _posted("c-b:0"),
            "c": Seen(state="claimed"),
            "d": Seen(state="ready_to_deliver"),
        },
        [_line("c-a"), _line("c-a")],
        stuck=("d",),
    )
    assert (report.duplicated, report.phantom_receipts, report.lost, report.stuck) == (1, 1, 1, 1)
    assert not report.ok


def test_a_claim_without_result_may_stay_claimed() -> None:
    report = _judge({"a": Seen(state="claimed")}, [], results=set())
    assert report.ok and report.states == {"claimed": 1}


def test_health_and_percentiles() -> None:
    assert expected_health({"delivered": 3, "delivery_unknown": 1}) == "unhealthy"
    assert expected_health({"delivered": 3, "claimed": 1}) == "degraded"
    assert expected_health({"delivered": 3}) == "healthy"
    assert percentiles([]) == {}
    assert percentiles([float(v) for v in range(1, 101)]) == {
        "n": 100,
        "p50": 50.0,
        "p99": 99.0,
        "max": 100.0,
    }


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_sigkill_smoke_under_retention_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    # Services forked from a preloaded fork server, as in the soak (cheaper; the refuse-start
    # test keeps the cold start). A retention limit of 2 tombstones, with work done between
    # kills, makes restarts evict: the verdict must account for those records by their outbox
    # lines, not call them lost.
    report = run_killtest(
        kills=3,
        continuations=400,
        threads=4,
        seed=1234,
        workdir=str(tmp_path),
        terminal_max_records=2,
        min_results_per_kill=10,
        preload=True,
    )
    assert report.ok, report.problems
    assert report.kills == 3 and report.acknowledged_results > 0
    assert report.evicted > 0 and report.evicted == sum(report.evicted_evidence.values())
    assert sum(report.outcomes.values()) == report.acknowledged_results
    assert report.recovery_ms["n"] == 3 and report.rss_mib["max"] > 0
    assert report.kills_per_minute > 0 and report.continuations_per_kill > 0


@pytest.mark.timeout(180)
def test_a_record_deleted_behind_the_services_back_is_flagged(tmp_path: Path) -> None:
    report = run_killtest(
        kills=1,
        continuations=60,
        threads=2,
        seed=5,
        workdir=str(tmp_path),
        plant="delete-record",
        preload=True,
    )
    assert not report.ok
    # Either the service noticed and refused to start, or the record is gone: both fail.
    if report.refused_start is None:
        assert report.lost == 1, report.problems
        assert any(p.startswith(PLANT_KEY) for p in report.problems), report.problems
    else:
        assert report.kills == 1


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_a_service_that_refuses_to_start_after_a_kill_is_flagged(tmp_path: Path) -> None:
    report = run_killtest(
        kills=2,
        continuations=60,
        threads=2,
        seed=5,
        workdir=str(tmp_path),
        plant="refuse-start",
    )
    assert not report.ok
    assert report.refused_start is not None and report.refused_start.startswith("after kill 1:")
    assert report.kills == 1


@pytest.mark.skipif(
    not os.environ.get("AFTERWORD_KILLTEST_SOAK"), reason="set AFTERWORD_KILLTEST_SOAK to run"
)
@pytest.mark.timeout(4 * 3600)
def test_soak_of_many_kills_finds_no_problem(tmp_path: Path) -> None:
    value = os.environ["AFTERWORD_KILLTEST_SOAK"]
    kills = SOAK["kills"] if value == "1" else int(value)
    report = run_killtest(**{**SOAK, "kills": kills}, workdir=str(tmp_path))
    assert report.ok, report.problems
    assert report.kills == kills

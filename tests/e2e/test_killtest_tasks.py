"""The kill test's Tasks workload (tools/killtest/tasks.py): its verdict on made-up evidence, the
command line, and a bounded SIGKILL run against a real Tasks server.

The full run (at least 200 kills) is a documented command, not CI (docs/crash-testing.md):
``python -m tools.killtest --workload tasks --kills 200 --seed 32 --json tasks-kill.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.killtest.__main__ import main as killtest_main
from tools.killtest.tasks import TasksReport, judge_tasks
from tools.killtest.verdict import Seen


def _report(n: int) -> TasksReport:
    return TasksReport(seed=0, kills=1, continuations=n, acknowledged_claims=n, acknowledged_results=n)


def _line(cid: str, text: str) -> dict[str, Any]:
    return {"deliveryKey": f"{cid}:0", "chunkCount": 1, "text": text}


def _delivered(cid: str) -> Seen:
    return Seen(state="delivered", receipt_kind="posted", delivery_ids=(f"{cid}:0",))


def test_each_task_delivered_once_with_its_own_answer_is_ok() -> None:
    report = _report(2)
    adopted = {"task-1": {"c1"}, "task-2": {"c2"}}
    final = {"task-1": _delivered("c1"), "task-2": Seen(state="dead_lettered", cause="synthesis_interrupted")}
    judge_tasks(report, adopted, final, [_line("c1", "done: answer for task-1")], ())
    assert report.ok, report.problems
    assert report.outcomes == {"delivered": 1, "dead_lettered": 1}
    assert report.dead_lettered_by_cause == {"synthesis_interrupted": 1}
    assert report.continuations_per_task == {"1": 2}


def test_a_task_adopted_as_two_continuations_is_duplicated() -> None:
    report = _report(1)
    judge_tasks(report, {"task-1": {"c1", "c9"}}, {"task-1": _delivered("c1")}, [_line("c1", "task-1")], ())
    assert not report.ok and report.duplicated == 1
    assert report.continuations_per_task == {"2": 1}


def test_an_answer_posted_twice_is_duplicated() -> None:
    report = _report(1)
    lines = [_line("c1", "task-1"), _line("c1", "task-1")]
    judge_tasks(report, {"task-1": {"c1"}}, {"task-1": _delivered("c1")}, lines, ())
    assert not report.ok and report.duplicated == 1


def test_another_tasks_answer_is_misdelivered() -> None:
    report = _report(1)
    judge_tasks(
        report, {"task-1": {"c1"}}, {"task-1": _delivered("c1")}, [_line("c1", "answer for task-7")], ()
    )
    assert not report.ok and report.misdelivered == 1


def test_a_task_gone_without_evidence_is_lost_and_one_never_ending_is_stuck() -> None:
    report = _report(2)
    final = {"task-1": None, "task-2": Seen(state="result_received")}
    judge_tasks(report, {"task-1": {"c1"}, "task-2": {"c2"}}, final, [], ["task-2"])
    assert not report.ok and (report.lost, report.stuck) == (1, 1)


def test_the_command_line_refuses_options_of_the_claims_workload(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (["--plant", "refuse-start"], ["--threads", "2"], ["--soak"]):
        with pytest.raises(SystemExit) as exit_:
            killtest_main(["--workload", "tasks", *extra])
        assert exit_.value.code == 2
    assert "--workload tasks takes" in capsys.readouterr().err


def test_a_forgotten_runs_fallback_answer_is_not_misdelivered() -> None:
    """A restart before activate forgets the run: its task is answered with the fixed
    origin-unavailable text, a visible end, not another task's answer."""
    report = _report(1)
    lines = [_line("c1", "I could not finish answering this request.")]
    judge_tasks(report, {"task-1": {"c1"}}, {"task-1": _delivered("c1")}, lines, (), forgotten=["task-1"])
    assert report.ok and report.runs_forgotten == 1


@pytest.mark.slow
def test_tasks_finishing_while_afterword_is_down_starting_or_polling_are_answered_once(
    tmp_path: Path,
) -> None:
    """Five SIGKILLs of a real ``afterword serve`` following a real Tasks server's tasks."""
    from tools.killtest.tasks import run_tasks_killtest

    report = run_tasks_killtest(kills=5, seed=7, workdir=str(tmp_path), interval=(0.3, 0.9))
    assert report.ok, report.problems
    assert (report.kills, report.lost, report.duplicated, report.stuck, report.misdelivered) == (
        5,
        0,
        0,
        0,
        0,
    )
    assert report.adopted >= 5 and report.continuations_per_task == {"1": report.adopted}
    # every adopted task ended: delivered once, or visibly (a dead letter with its cause)
    assert sum(report.outcomes.values()) == report.adopted
    assert report.outbox_lines == report.outcomes.get("delivered", 0)
    assert set(report.gates_opened) <= {"down", "starting", "polling", "end"}

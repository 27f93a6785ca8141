"""A bounded kill test in CI: SIGKILL `afterword serve` under load; nothing lost or doubled."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.killtest import run_killtest


@pytest.mark.timeout(300)
def test_sigkill_under_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    report = run_killtest(kills=3, continuations=400, threads=4, seed=1234, workdir=str(tmp_path))
    assert report.kills >= 1
    assert report.acknowledged_claims > 0 and report.acknowledged_results > 0
    assert (report.lost, report.duplicated, report.stuck) == (0, 0, 0), report.problems
    assert report.health_consistent, report.problems
    assert sum(report.states.values()) == report.acknowledged_claims

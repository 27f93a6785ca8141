"""``python -m bench.jobqueue`` runs and wires its ratios to the right rows (no figure asserted)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/ is a top-level folder, not part of the installed package
    sys.path.insert(0, str(ROOT))

from bench import jobqueue  # noqa: E402

GUIDE_COMMAND = "python -m bench.jobqueue --quick --json jobqueue.json"  # docs/durability-layer.md


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_guides_command_measures_every_system_at_1_and_32_workers(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # run from elsewhere: bench/ is not installed
    argv = [sys.executable, *shlex.split(GUIDE_COMMAND)[1:]]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x best SQLite" in proc.stdout
    out = tmp_path / "jobqueue.json"
    rows = {(r["system"], r["workers"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {
        ("jobqueue", 1),
        ("sqlite", 1),
        ("jobqueue", 32),
        ("sqlite", 32),
        ("sqlite-shared", 32),
    }
    for key, r in rows.items():
        assert r["jobs_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0, key
    for workers in (1, 32):
        jq, sqlite = rows[("jobqueue", workers)], rows[("sqlite", workers)]
        assert jq["ratio_to_sqlite"] == pytest.approx(jq["jobs_per_s"] / sqlite["jobs_per_s"])
    assert rows[("jobqueue", 32)]["scaling"] == pytest.approx(
        rows[("jobqueue", 32)]["jobs_per_s"] / rows[("jobqueue", 1)]["jobs_per_s"]
    )


def test_ratios_use_the_same_worker_count_and_the_faster_sqlite() -> None:
    rows = [
        jobqueue.Row("jobqueue", 1, 100.0),
        jobqueue.Row("sqlite", 1, 50.0),
        jobqueue.Row("jobqueue", 32, 800.0),
        jobqueue.Row("sqlite", 32, 20.0),
        jobqueue.Row("sqlite-shared", 32, 200.0),
    ]
    jobqueue.ratios(rows)
    got = {(r.system, r.workers): (r.ratio_to_sqlite, r.ratio_to_best_sqlite, r.scaling) for r in rows}
    assert got[("jobqueue", 1)] == (2.0, 2.0, 1.0)
    assert got[("jobqueue", 32)] == (40.0, 4.0, 8.0)
    assert got[("sqlite-shared", 32)] == (10.0, 1.0, 4.0)
    assert "sqlite-shared" in jobqueue.render(rows)

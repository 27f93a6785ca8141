"""``bench.e2e`` still runs: every requested scenario produces a positive rate, the ratios are
wired to the right rows, and the RSS fixture is opened by a real ``afterword serve``.

No figure is asserted (times on shared machines drift). The DBOS peer needs the ``bench``
extra; without it the run must say why instead of failing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.e2e import Figure, process_cpu_seconds, ratios

REPO = Path(__file__).resolve().parents[2]


def test_ratios_pair_each_scenario_with_the_bare_ceiling_at_its_producer_count() -> None:
    figures = [
        Figure("bare (2 req)", 1, 100, 1.0),
        Figure("bare (2 req)", 32, 100, 0.5),
        Figure("detached (serve)", 1, 100, 2.0),
        Figure("detached (serve)", 32, 100, 1.0),
        Figure("dbos (64 in flight)", 64, 100, 4.0),
    ]
    got = {(r["scenario"], r["producers"], r["against"]): r["ratio"] for r in ratios(figures)}
    assert got == {
        ("detached (serve)", 1, "bare"): 0.5,
        ("detached (serve)", 32, "bare"): 0.5,
        ("detached (serve)", 1, "dbos"): 2.0,
        ("detached (serve)", 32, "dbos"): 4.0,
    }


def test_process_cpu_seconds_reads_this_process_and_never_goes_back() -> None:
    first = process_cpu_seconds(os.getpid())
    sum(i * i for i in range(200_000))  # some CPU, so the counter has something to count
    second = process_cpu_seconds(os.getpid())
    assert 0 <= first <= second


def test_cpu_per_continuation_is_the_server_cpu_divided_by_the_batch() -> None:
    assert Figure("detached (serve)", 32, 200, 1.0, cpu_seconds=0.5).cpu_ms == 2.5
    assert Figure("dbos (64 in flight)", 64, 200, 1.0).cpu_ms is None


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_e2e_small_run_reports_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "e2e.json"
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    args = ["--producers", "1", "--n", "20", "--scenarios", "bare", "detached", "dbos", "rss"]
    args += ["--rss-active", "100", "--rss-tombstones", "300", "--json", str(out), "--scratch", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.e2e", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = {r["scenario"]: r for r in data["rows"]}
    assert {"bare (2 req)", "detached (serve)"} <= rows.keys()
    assert all(r["rate"] > 0 for r in data["rows"])
    assert rows["detached (serve)"]["p50_ms"] is not None
    for scenario in ("bare (2 req)", "detached (serve)"):  # the server's CPU per continuation
        assert rows[scenario]["cpu_ms_per_continuation"] > 0
    assert any(r["against"] == "bare" and r["producers"] == 1 for r in data["ratios"])
    if importlib.util.find_spec("dbos") is not None:
        assert "dbos (64 in flight)" in rows, data["errors"]
    else:
        assert "dbos" in data["errors"]
    rss = data["rss"]
    assert rss["active"] == 100 and rss["tombstones"] == 300
    assert rss["rss_mib"] > 0 and rss["empty_rss_mib"] > 0
    assert len(data["machine"]["loadavg_before"]) == 3


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_baseline_measures_this_serve_and_the_baselines_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "e2e.json"
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    args = ["--producers", "1", "--n", "5", "--scenarios", "detached", "--baseline", str(REPO)]
    args += ["--json", str(out), "--scratch", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.e2e", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["scenario"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows.keys() == {"detached (serve)", f"detached (serve of {REPO.name})"}
    assert all(r["rate"] > 0 and r["cpu_ms_per_continuation"] > 0 for r in rows.values())

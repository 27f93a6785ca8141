"""The slow marker: registered, skipped by the default run, and still run by CI."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_slow_is_registered_and_deselected_by_default() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(marker.startswith("slow:") for marker in options["markers"])
    addopts = shlex.split(options["addopts"])
    assert addopts[addopts.index("-m") + 1] == "not slow"


def test_ci_runs_the_default_suite_and_then_the_slow_tests() -> None:
    # Without the second step the slow tests would run nowhere.
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "python -m pytest -q" in lines
    assert "python -m pytest -q -m slow" in lines
    assert lines.index("python -m pytest -q -m slow") > lines.index("python -m pytest -q")


def test_the_suite_runs_in_two_processes_wherever_ci_runs_it() -> None:
    # addopts carries -n 2, so every venv that runs pytest here needs pytest-xdist: the test
    # extra, and the MCP 1.x venv that .ci/run installs by hand.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    addopts = shlex.split(project["tool"]["pytest"]["ini_options"]["addopts"])
    assert addopts[addopts.index("-n") + 1] == "2"
    assert any(req.startswith("pytest-xdist") for req in project["project"]["optional-dependencies"]["test"])
    installs = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if "pip install" in line and "pytest" in line
    ]
    assert installs and all("pytest-xdist" in line for line in installs), installs

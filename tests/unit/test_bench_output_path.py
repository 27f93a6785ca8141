"""Benchmarks refuse an output file in a missing directory before they measure anything."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from bench import committer, compare, e2e, jobqueue

MISSING = "/nonexistent-afterword-dir/out.json"


@pytest.mark.parametrize(
    ("run", "args"),
    [
        (committer.main, ["--json", MISSING]),
        (compare.main, ["--quick", "--json", MISSING]),
        (compare.main, ["--quick", "--plot", MISSING]),
        (e2e.parse, ["--json", MISSING]),
        (jobqueue.main, ["--quick", "--json", MISSING]),
    ],
)
def test_a_missing_output_directory_is_refused_at_once(
    run: Callable[[Sequence[str]], object], args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        run(args)
    assert exited.value.code == 2
    assert "does not exist" in capsys.readouterr().err

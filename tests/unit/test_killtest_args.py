"""The kill test refuses counts that would make it verify nothing (fast: no service starts)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.killtest.__main__ import main


@pytest.mark.parametrize("flag", ["--kills", "--continuations", "--threads", "--terminal-max-records"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_counts_below_one_are_refused(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([flag, value])
    assert exited.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err

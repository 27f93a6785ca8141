"""The installed ``afterword`` script ends quietly when its reader goes away (``| head``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "afterword"


@pytest.mark.skipif(not SCRIPT.exists(), reason="the console script is not installed in this venv")
def test_console_script_prints_no_traceback_when_stdout_is_closed(tmp_path: Path) -> None:
    # The read end is closed before the child writes, so its first write gets EPIPE; the
    # console script (unlike `python -m afterword`) keeps Python's ignored SIGPIPE.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [str(SCRIPT), "continuations", "doctor", "--state-dir", str(tmp_path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.stderr.decode() == ""
    assert proc.returncode == 128 + signal.SIGPIPE

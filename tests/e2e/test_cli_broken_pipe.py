"""The installed ``afterword`` script ends quietly when its reader goes away (``| head``)."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("entry", [["-m", "afterword.cli"], ["-m", "afterword"]])
def test_serve_ignores_sigpipe_even_under_python_m(tmp_path: Path, entry: list[str]) -> None:
    """`python -m afterword` restores SIGPIPE's default for the verbs; `serve` must ignore it
    again, or a write to a socket whose peer has gone kills the whole service (the Tasks kill
    test saw `serve` exit with -13 while its follower polled a server)."""
    import socket
    import time

    from _service import write_config

    config = write_config(tmp_path)
    port = json.loads(config.read_text())["continuations"]["port"]
    proc = subprocess.Popen(
        [sys.executable, *entry, "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "AFTERWORD_TEST_DETACHED_TOKEN": "detached-token-0123456789abcdef"},
    )
    try:
        give_up = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < give_up, proc.returncode
                time.sleep(0.05)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
        assert ignored & (1 << (signal.SIGPIPE - 1))
    finally:
        proc.terminate()
        proc.wait(timeout=30)

"""Start `afterword serve`: as a new interpreter, or forked from a server with afterword imported.

A cold start spends most of its CPU importing (about 0.65 s on the 2-core development
machines, several seconds of wall time when they are loaded), which a 1,000-kill soak pays a
thousand times without learning anything about recovery. ``preload=True`` forks each
service from a multiprocessing fork server that imported afterword once; the child then runs
the same ``afterword serve`` entry point on the same state, so what is killed and recovered
is unchanged. Nothing is opened, started or threaded before the fork: imports only.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing.context import ForkServerContext
from typing import Any

PRELOAD = [
    "afterword.cli",
    "afterword.cli.serve",
    "afterword.runtime",
    "afterword.http.server",
    "afterword.worker",
]
_context: ForkServerContext | None = None


def _serve_child(config: str, log: str, env: dict[str, str]) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.update(env)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as `python -m afterword.cli` does
    from afterword.cli import main

    code = main(["serve", "--config", config])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ForkedServe:
    """The subset of ``subprocess.Popen`` the kill test uses, for a fork-server child."""

    def __init__(self, config: str, log: str, env: dict[str, str]) -> None:
        global _context
        if _context is None:
            _context = multiprocessing.get_context("forkserver")
            _context.set_forkserver_preload(PRELOAD)
        self._proc = _context.Process(target=_serve_child, args=(config, log, env), daemon=False)
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return None if self._proc.is_alive() else self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.is_alive():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired("afterword serve", timeout or 0)
        return self._proc.exitcode


def start_serve(config: str, log: str, env: dict[str, str], *, preload: bool) -> Any:
    """A running ``afterword serve --config config``, its output appended to ``log``."""
    if preload:
        return ForkedServe(config, log, env)
    out = open(log, "ab")  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "afterword.cli", "serve", "--config", config],
            stdout=out,
            stderr=out,
            env={**os.environ, **env},
        )
    finally:
        out.close()

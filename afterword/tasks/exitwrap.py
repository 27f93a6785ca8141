"""The exit-status wrapper every background command runs under (a stand-alone script).

``python -I exitwrap.py STATUS TEMP -- COMMAND...`` runs ``COMMAND`` as its child and, when the
child ends, writes ``{"returncode": N}`` (negative: killed by signal -N) to ``STATUS``
durably - temp file, fsync, rename, fsync of the directory - then ends the same way the child
did. The supervisor that started it may be gone by then: a supervisor restarted later reads
the file and learns how an adopted command really ended instead of calling it ``lost``.

The child's output goes straight to the file the supervisor opened as this script's stdout
and stderr: no pipe, so a supervisor killed with SIGKILL cannot take the child down with it.

Signals: the wrapper leads the task's process group. SIGTERM, SIGINT and SIGHUP sent to it
are passed on once to the whole group (the wrapper ignores its own copy) and the wrapper
stays to record the end; only SIGKILL stops it without a record.

Only the standard library is imported (interpreter start-up is paid per task), which is why
this file writes its one small file with plain ``os`` calls rather than the disk seam.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from types import FrameType

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def write_status(path: str, temp: str, status: dict[str, object]) -> None:
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, json.dumps(status).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        sys.stderr.write("usage: exitwrap.py STATUS TEMP -- COMMAND...\n")
        return 2
    status_path, temp_path, command = argv[1], argv[2], argv[4:]
    child: subprocess.Popen[bytes] | None = None
    early: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if child is None:
            early.append(signum)
            return
        signal.signal(signum, signal.SIG_IGN)  # our own copy of the group signal is dropped
        try:
            os.killpg(os.getpgrp(), signum)
        except OSError:
            pass
        finally:
            signal.signal(signum, forward)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        write_status(status_path, temp_path, {"spawn_error": f"{type(exc).__name__}: {exc.strerror or exc}"})
        return 127
    for signum in early:
        forward(signum, None)
    returncode = child.wait()
    write_status(status_path, temp_path, {"returncode": returncode})
    if returncode < 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""One background command as the operating system sees it: spawned under the exit-status
wrapper, waited for, signalled, and its capture bounded once it ended.

The supervisor decides *when* to do these things and records what happened in the journal;
this module only does them. See :mod:`afterword.tasks.supervisor` for why every command runs
under :mod:`afterword.tasks.exitwrap` in its own session and process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

import anyio
import msgspec

from ..disk import StateRoot, UnsafeStateError
from ..disk.safe import TEMP_MARK
from . import exitwrap
from .journal import OUTPUT_DIR, TaskJournal
from .processes import ExitStatus

DEFAULT_MAX_OUTPUT = 1024 * 1024
MARKER_SLACK = 64  # a capture this far over the budget is kept whole (the marker's own size)
_status_decoder = msgspec.json.Decoder(ExitStatus)


def spawn_wrapped(
    root: StateRoot,
    task_id: str,
    command: Sequence[str],
    *,
    output_fd: int,
    cwd: str | None,
    env: Mapping[str, str] | None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` under the wrapper, its stdout and stderr going to ``output_fd``.

    Raises:
        OSError: not even the wrapper could be started.
    """
    status = root.path(TaskJournal.exit_status_path(task_id))
    temp = root.path(f"{OUTPUT_DIR}/.{task_id}.exit{TEMP_MARK}{task_id}")
    return subprocess.Popen(
        [sys.executable, "-I", exitwrap.__file__, status, temp, "--", *command],
        stdin=subprocess.DEVNULL,
        stdout=output_fd,
        stderr=output_fd,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )


def read_exit_status(root: StateRoot, task_id: str) -> ExitStatus | None:
    """What the wrapper recorded when the command ended; None when it recorded nothing usable."""
    rel = TaskJournal.exit_status_path(task_id)
    if not root.exists(rel):
        return None
    try:
        return _status_decoder.decode(root.read_file(rel, max_size=4096))
    except msgspec.DecodeError:
        return None  # a torn or foreign file is no record of how the command ended


def bound_output(root: StateRoot, rel: str, limit: int) -> tuple[int, bool]:
    """Cut a finished capture down to ``limit``: the first half, a marker naming how many
    bytes were left out, the last half. Returns ``(bytes printed, truncated)``."""
    try:
        handle = root.open_file(rel, writable=True)
    except UnsafeStateError as exc:
        if exc.rule != "missing":
            raise
        return 0, False
    except IsADirectoryError:
        # Swapped for a directory (by the command itself): name the rule it broke.
        raise UnsafeStateError(root.path(rel), "not_regular", "a directory") from None
    try:
        size = root.disk.fstat(handle.fd).st_size
        truncated = size > limit + MARKER_SLACK
        if truncated:
            head = limit // 2
            tail = root.pread(handle, limit - head, size - (limit - head))
            marker = f"\n[... {size - head - len(tail)} bytes of output omitted ...]\n".encode()
            root.pwrite(handle, marker + tail, head)
            root.truncate(handle, head + len(marker) + len(tail))
        root.fsync(handle)
        return size, truncated
    finally:
        root.close(handle)


async def wait_exit(process: subprocess.Popen[bytes], poll_interval: float) -> None:
    """Until ``process`` has exited (not reaped): a pidfd where the kernel has one, else polling."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        while process.poll() is None:
            await anyio.sleep(min(poll_interval, 0.05))
        return
    try:
        await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)


def signal_pid(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        # The group leader exited and the id names nothing of ours any more.
        pass

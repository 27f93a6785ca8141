"""Process identity: does a recorded pid still name the process we started?

A pid alone is not an identity - the kernel reuses pids. The identity is the boot id plus the
process start time (``/proc/<pid>/stat`` field 22, in clock ticks since boot), which together
name one process instance. Where ``/proc`` is unavailable the answer is ``unknown`` and the
caller treats the process as unaccounted for. These reads touch kernel state, not the state
directory, so they do not go through the disk seam.
"""

from __future__ import annotations

import os

from .processes import ProbeResult

_PROC = "/proc"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def boot_id() -> str | None:
    text = _read(f"{_PROC}/sys/kernel/random/boot_id")
    return text.strip() if text else None


def _stat_fields(pid: int) -> list[str] | None:
    text = _read(f"{_PROC}/{pid}/stat")
    if text is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return text[text.rfind(")") + 2 :].split()


def process_identity(pid: int) -> str | None:
    """``"<boot id>:<start ticks>"`` for a live pid, or None if it cannot be established."""
    boot = boot_id()
    fields = _stat_fields(pid)
    if boot is None or fields is None or len(fields) < 20:
        return None
    return f"{boot}:{fields[19]}"


def probe(pid: int, identity: str | None) -> ProbeResult:
    """``alive`` only when the pid still names the same, not yet exited, process instance."""
    if identity is None or boot_id() is None:
        return "unknown"
    fields = _stat_fields(pid)
    if fields is None:
        return "gone"
    if fields[0] in ("Z", "X"):  # exited, waiting to be reaped: its work is over
        return "gone"
    return "alive" if process_identity(pid) == identity else "gone"


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir(_PROC) if name.isdigit()]
    except OSError:
        return []


def leftovers(pid: int, identity: str | None) -> list[int]:
    """Live processes still in the process group the task's wrapper led (``pgid == pid``).

    Empty when the group cannot be ours: another boot, or a live process that now holds the
    pid under another identity (the kernel does not reuse a pid while a group still bears
    it, so a reused pid means our group is gone).
    """
    if identity is None or boot_id() is None or not identity.startswith(f"{boot_id()}:"):
        return []
    leader = _stat_fields(pid)
    if leader is not None and leader[0] not in ("Z", "X") and process_identity(pid) != identity:
        return []
    members = []
    for other in _pids():
        fields = _stat_fields(other)
        # fields[0] is the state, fields[2] the process group id.
        if fields is not None and len(fields) > 2 and fields[2] == str(pid) and fields[0] not in ("Z", "X"):
            members.append(other)
    return members


def find_by_argument(argument: str) -> int | None:
    """A live process with ``argument`` among its command-line arguments (the wrapper of a
    task whose pid was never recorded: its status path names the task)."""
    wanted = argument.encode()
    for pid in _pids():
        try:
            with open(f"{_PROC}/{pid}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if wanted in args:
            return pid
    return None

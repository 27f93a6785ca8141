"""Process identity: does a recorded pid still name the process we started?

A pid alone is not an identity - the kernel reuses pids. The identity is the boot id plus the
process start time (``/proc/<pid>/stat`` field 22, in clock ticks since boot), which together
name one process instance. Where ``/proc`` is unavailable the answer is ``unknown`` and the
caller treats the process as unaccounted for. These reads touch kernel state, not the state
directory, so they do not go through the disk seam.
"""

from __future__ import annotations

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

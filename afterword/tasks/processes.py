"""Process facts of the task journal: a task's record from spawn to its one terminal state.

Pure, like the rest of :mod:`.core` (invariant 1 there): how a process ended is classified
here, and a restarted supervisor asks :func:`recovery_action` what to do with a task it did not
start. The terminal event id is derived from the task id, so every replay agrees on it.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Sequence
from typing import Literal

import blake3
import msgspec

from .errors import refused
from .records import TERMINAL_STATES, NotifyPolicy, TaskRecord, TaskState

NOTIFICATION_PREFIX = "task-notification:"

_replace = msgspec.structs.replace

# Lifecycle table: state -> states it may move to. Terminal states have no exits (invariant 1).
LIFECYCLE: dict[str, frozenset[str]] = {
    "running": TERMINAL_STATES,
    **{state: frozenset() for state in TERMINAL_STATES},
}


# -- ids ---------------------------------------------------------------------------------------
def event_id_for(task_id: str) -> str:
    """The task's terminal event id: derived, so recovery and replay always agree on it."""
    return "tev_" + blake3.blake3(b"afterword-task-terminal\x00" + task_id.encode()).hexdigest()[:32]


def notification_id_for(event_id: str) -> str:
    """The notification message id: one per terminal event, the history's idempotency key."""
    return NOTIFICATION_PREFIX + event_id


def is_terminal(task: TaskRecord) -> bool:
    return task.state in TERMINAL_STATES


# -- process facts -----------------------------------------------------------------------------
def new_task(
    *,
    task_id: str,
    session_id: str,
    tool_call_id: str,
    command: Sequence[str],
    notify: NotifyPolicy,
    cwd: str | None,
    output_path: str,
    now: float,
    timeout: float | None = None,
) -> TaskRecord:
    """A task record written before its process is spawned (so no process is ever untracked).

    ``timeout``: seconds after which a still running task is stopped (``killed``, notified
    with the reason).
    """
    if not command:
        raise ValueError("a task needs a command")
    if timeout is not None and not timeout > 0:
        raise ValueError("a task's timeout must be a positive number of seconds")
    return TaskRecord(
        task_id=task_id,
        session_id=session_id,
        tool_call_id=tool_call_id,
        command=tuple(command),
        cwd=cwd,
        notify=notify,
        created_at=now,
        output_path=output_path,
        timeout_at=None if timeout is None else now + timeout,
    )


def spawned(task: TaskRecord, *, pid: int, identity: str | None, now: float) -> TaskRecord:
    if task.state != "running" or task.pid is not None:
        raise refused(task.task_id, task.state, "spawned")
    return _replace(task, pid=pid, process_identity=identity, started_at=now)


def adopted(task: TaskRecord) -> TaskRecord:
    if task.state != "running":
        raise refused(task.task_id, task.state, "adopted")
    return _replace(task, adopted=True)


def request_cancel(task: TaskRecord) -> TaskRecord:
    """Record the intent first, so a signal death after a crash still reads as cancelled."""
    if is_terminal(task) or task.cancel_requested:
        return task
    return _replace(task, cancel_requested=True)


def request_timeout(task: TaskRecord) -> TaskRecord:
    """The task's own deadline passed: it is stopped, and the model is told it timed out."""
    if is_terminal(task) or task.cancel_requested or task.timed_out:
        return task
    return _replace(task, timed_out=True)


def request_stop(task: TaskRecord) -> TaskRecord:
    """The host is shutting down and stops the task: not a user's cancel, so the model is told."""
    if is_terminal(task) or task.stop_requested or task.cancel_requested:
        return task
    return _replace(task, stop_requested=True)


HOST_STOPPED = (
    "the host shut down and stopped this task before it finished; it did not complete and "
    "may need to be run again"
)


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a process ended, classified."""

    state: TaskState
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None


def timed_out_error(task: TaskRecord) -> str:
    limit = (task.timeout_at or 0.0) - task.created_at
    return f"the task ran past its timeout of {limit:g} s and was stopped; it did not complete"


def classify_exit(
    returncode: int, *, cancel_requested: bool, stop_requested: bool = False, timed_out: str | None = None
) -> Outcome:
    """Exit 0 -> exited; other codes -> failed; a signal -> killed (cancelled if we asked).

    A task the host stopped at shutdown that did not exit 0 is ``killed`` with
    :data:`HOST_STOPPED` as its error: unlike a cancel, the model hears about it. One its
    timeout stopped is ``killed`` with ``timed_out`` (the reason) as its error.
    """
    if timed_out is not None and not cancel_requested and returncode != 0:
        if returncode < 0:
            return Outcome(state="killed", signal=-returncode, error=timed_out)
        return Outcome(state="killed", exit_code=returncode, error=timed_out)
    if stop_requested and not cancel_requested and returncode != 0:
        if returncode < 0:
            return Outcome(state="killed", signal=-returncode, error=HOST_STOPPED)
        return Outcome(state="killed", exit_code=returncode, error=HOST_STOPPED)
    if returncode < 0:
        return Outcome(state="cancelled" if cancel_requested else "killed", signal=-returncode)
    if cancel_requested and returncode != 0:
        return Outcome(state="cancelled", exit_code=returncode)
    return Outcome(state="exited" if returncode == 0 else "failed", exit_code=returncode)


def spawn_failure(error: str) -> Outcome:
    return Outcome(state="failed", error=f"could not start: {error}")


LOST_NEVER_RECORDED = (
    "the supervisor stopped before recording a process id; whether the command ran is unknown"
)
LOST_VANISHED = (
    "the process was gone when the supervisor restarted and left no exit status (its wrapper "
    "was killed); its exit status and side effects are unknown"
)
LOST_UNSUPERVISED_EXIT = (
    "the process ended after a supervisor restart without an exit status on record (its "
    "wrapper was killed); its exit status and side effects are unknown"
)


ProbeResult = Literal["alive", "gone", "unknown"]
RecoveryAction = Literal["keep", "adopt", "end"]


class ExitStatus(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the exit-status wrapper recorded when the command ended."""

    returncode: int | None = None
    spawn_error: str | None = None


def recorded_end(task: TaskRecord, status: ExitStatus) -> Outcome:
    """The end the wrapper wrote down: known, even when no supervisor was watching."""
    if status.spawn_error is not None or status.returncode is None:
        return spawn_failure(status.spawn_error or "the command did not start")
    return classify_exit(
        status.returncode,
        cancel_requested=task.cancel_requested,
        stop_requested=task.stop_requested,
        timed_out=timed_out_error(task) if task.timed_out else None,
    )


def recovery_action(
    task: TaskRecord, probe: ProbeResult, status: ExitStatus | None = None
) -> tuple[RecoveryAction, Outcome | None]:
    """What a restarted supervisor does with a task it did not start in this life.

    A process that the identity check proves alive is adopted (still ``running``). One that
    is gone ended with the status its wrapper recorded; without a record the end cannot be
    accounted for and becomes ``lost`` - the journal does not guess an outcome. A task we had
    already asked to stop reads as ``cancelled``, with the same doubt recorded.
    """
    if task.state != "running":
        return "keep", None
    if status is not None and probe != "alive":
        return "end", recorded_end(task, status)
    if task.pid is None:
        return "end", _unaccounted(task, LOST_NEVER_RECORDED)
    if probe == "alive":
        return "adopt", None
    return "end", _unaccounted(task, LOST_VANISHED)


def leftovers_stopped(outcome: Outcome, count: int) -> Outcome:
    """A task about to be recorded as ``lost`` still had processes running: they were stopped
    first, so nothing it does happens after the journal gave up on it."""
    if count == 0:
        return outcome
    note = f"{count} process(es) of its group were still running and were killed before this was recorded"
    return msgspec.structs.replace(outcome, error=f"{outcome.error}; {note}" if outcome.error else note)


def unsupervised_end(task: TaskRecord) -> Outcome:
    """An adopted process disappeared: nobody could wait() for it, so its status is unknown."""
    return _unaccounted(task, LOST_UNSUPERVISED_EXIT)


def _unaccounted(task: TaskRecord, reason: str) -> Outcome:
    return Outcome(state="cancelled" if task.cancel_requested else "lost", error=reason)


def terminate(
    task: TaskRecord,
    outcome: Outcome,
    *,
    now: float,
    output_bytes: int | None = None,
    output_truncated: bool | None = None,
) -> TaskRecord:
    """Record the terminal state and its stable event id (invariant 1)."""
    if outcome.state not in LIFECYCLE[task.state]:
        if task.state == outcome.state:
            return task  # a replayed report of the same end changes nothing
        raise refused(task.task_id, task.state, outcome.state)
    return _replace(
        task,
        state=outcome.state,
        exit_code=outcome.exit_code,
        signal=outcome.signal,
        error=outcome.error,
        ended_at=now,
        output_bytes=task.output_bytes if output_bytes is None else output_bytes,
        output_truncated=task.output_truncated if output_truncated is None else output_truncated,
        event_id=event_id_for(task.task_id),
    )


def task_file_fault(outcome: Outcome, fault: str) -> Outcome:
    """The task tampered with its own capture or exit-status file: that fails the task (and
    only it), keeping what is known of how the process ended."""
    error = fault if outcome.error is None else f"{fault}; {outcome.error}"
    state: TaskState = outcome.state if outcome.state in ("killed", "cancelled", "lost") else "failed"
    return Outcome(state=state, exit_code=outcome.exit_code, signal=outcome.signal, error=error)


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"

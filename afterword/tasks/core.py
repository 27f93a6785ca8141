"""The task journal's decisions: pure functions of records, messages and a passed-in ``now``.

No I/O, no clock reads, no randomness. The effects layer (journal, supervisor, processor,
notifications, turn runner, coordinator) reads records, calls these, and writes the result.

Invariants (numbered; tests refer to them):

1. A task leaves ``running`` exactly once; its terminal state and ``event_id`` never change
   afterwards. The event id is derived from the task id, so it is the same on every replay.
2. ``committed`` is set only after the initial tool result is durable in the conversation,
   and a task has one initial tool result.
3. A notification is eligible only with an event id, committed, handed off, notify
   ``on_exit``, not delivered and not cancelled - and it is written only while the session's
   tool-call pairing is closed (checked by the caller with the session's messages).
4. A task whose terminal state the initial tool result already reported is never handed off,
   so it never gets a separate notification.
5. ``delivered`` needs the notification message to be durable first; ``consumed`` needs
   ``delivered`` (or a reported terminal state) and a successful model step that saw it.
6. Automatic continuation runs only for an idle session with a delivered notification to
   consume and no tool call waiting for its result, and never while interrupted, while the
   goal is paused or blocked, or after model retries ran out.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Iterable, Sequence
from typing import Literal

import blake3
import msgspec

from ..history import Message
from .errors import InvalidTransition
from .records import (
    TERMINAL_STATES,
    GoalState,
    NotifyPolicy,
    SessionControl,
    TaskRecord,
    TaskReference,
    TaskState,
)

NOTIFICATION_KIND = "task_notification"
HANDOFF_KIND = "compaction_handoff"
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
) -> TaskRecord:
    """A task record written before its process is spawned (so no process is ever untracked)."""
    if not command:
        raise ValueError("a task needs a command")
    return TaskRecord(
        task_id=task_id,
        session_id=session_id,
        tool_call_id=tool_call_id,
        command=tuple(command),
        cwd=cwd,
        notify=notify,
        created_at=now,
        output_path=output_path,
    )


def spawned(task: TaskRecord, *, pid: int, identity: str | None, now: float) -> TaskRecord:
    if task.state != "running" or task.pid is not None:
        raise InvalidTransition(task.task_id, task.state, "spawned")
    return _replace(task, pid=pid, process_identity=identity, started_at=now)


def adopted(task: TaskRecord) -> TaskRecord:
    if task.state != "running":
        raise InvalidTransition(task.task_id, task.state, "adopted")
    return _replace(task, adopted=True)


def request_cancel(task: TaskRecord) -> TaskRecord:
    """Record the intent first, so a signal death after a crash still reads as cancelled."""
    if is_terminal(task) or task.cancel_requested:
        return task
    return _replace(task, cancel_requested=True)


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


def classify_exit(returncode: int, *, cancel_requested: bool, stop_requested: bool = False) -> Outcome:
    """Exit 0 -> exited; other codes -> failed; a signal -> killed (cancelled if we asked).

    A task the host stopped at shutdown that did not exit 0 is ``killed`` with
    :data:`HOST_STOPPED` as its error: unlike a cancel, the model hears about it.
    """
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
        status.returncode, cancel_requested=task.cancel_requested, stop_requested=task.stop_requested
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


def unsupervised_end(task: TaskRecord) -> Outcome:
    """An adopted process disappeared: nobody could wait() for it, so its status is unknown."""
    return _unaccounted(task, LOST_UNSUPERVISED_EXIT)


def _unaccounted(task: TaskRecord, reason: str) -> Outcome:
    return Outcome(state="cancelled" if task.cancel_requested else "lost", error=reason)


def terminate(
    task: TaskRecord, outcome: Outcome, *, now: float, output_bytes: int | None = None,
    output_truncated: bool | None = None,
) -> TaskRecord:
    """Record the terminal state and its stable event id (invariant 1)."""
    if outcome.state not in LIFECYCLE[task.state]:
        if task.state == outcome.state:
            return task  # a replayed report of the same end changes nothing
        raise InvalidTransition(task.task_id, task.state, outcome.state)
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


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


# -- tool-call facts ---------------------------------------------------------------------------
def prepare_commit(task: TaskRecord, *, tool_result_id: str, reported_terminal: bool) -> TaskRecord:
    """Decide, before the tool result is written, whether it hands the task off.

    ``reported_terminal`` means the tool result itself tells the model how the task ended; that
    task is not handed off and will get no separate notification (invariant 4).
    """
    if task.tool_result_id is not None:
        if task.tool_result_id != tool_result_id:
            raise InvalidTransition(task.task_id, "tool result " + task.tool_result_id, "another tool result")
        return task
    if reported_terminal and task.event_id is None:
        raise InvalidTransition(task.task_id, task.state, "terminal state reported before it exists")
    return _replace(
        task,
        tool_result_id=tool_result_id,
        handed_off=not reported_terminal,
        terminal_reported=task.event_id if reported_terminal else None,
    )


def commit(task: TaskRecord, *, now: float) -> TaskRecord:
    """The tool result is durable in the conversation (invariant 2)."""
    if task.tool_result_id is None:
        raise InvalidTransition(task.task_id, "tool result not prepared", "committed")
    if task.committed:
        return task
    return _replace(task, committed=True, committed_at=now)


# -- notifications -----------------------------------------------------------------------------
def cancelled(task: TaskRecord) -> bool:
    return task.state == "cancelled" or task.cancel_requested


def blockers(task: TaskRecord) -> list[str]:
    """Why a notification is not (yet) eligible; empty means eligible (invariant 3)."""
    reasons: list[str] = []
    if task.event_id is None:
        reasons.append("no_terminal_event")
    if not task.committed:
        reasons.append("tool_result_not_committed")
    elif not task.handed_off:
        reasons.append("reported_in_tool_result" if task.terminal_reported else "not_handed_off")
    if task.notify != "on_exit":
        reasons.append("notify_off")
    if task.delivered:
        reasons.append("already_delivered")
    if cancelled(task):
        reasons.append("cancelled")
    return reasons


def eligible(task: TaskRecord) -> bool:
    return not blockers(task)


def deliverable(tasks: Iterable[TaskRecord], open_calls: set[str]) -> list[TaskRecord]:
    """The eligible tasks to notify now, oldest event first; none while a tool call is open."""
    if open_calls:
        return []
    ready = [t for t in tasks if eligible(t)]
    return sorted(ready, key=lambda t: (t.ended_at or 0.0, t.task_id))


def delivered(task: TaskRecord, *, notification_id: str, now: float) -> TaskRecord:
    """The notification message is durable in the session (invariant 5)."""
    if task.delivered:
        return task
    if task.event_id is None or notification_id != notification_id_for(task.event_id):
        raise InvalidTransition(task.task_id, task.state, "delivered with a foreign message id")
    return _replace(task, notification_id=notification_id, delivered=True, delivered_at=now)


# -- consumption -------------------------------------------------------------------------------
def needs_consumption(task: TaskRecord) -> bool:
    """A terminal fact the model has been (or will be) told about and has not yet handled."""
    if task.event_id is None or task.consumed or cancelled(task):
        return False
    if task.terminal_reported is not None:
        return task.committed
    return task.handed_off and task.notify == "on_exit"


def is_active(task: TaskRecord) -> bool:
    return task.state == "running"


def handoff_task_ids(message: Message) -> set[str]:
    if message.meta.get("kind") != HANDOFF_KIND:
        return set()
    refs = message.meta.get("task_refs")
    return set(refs.split()) if isinstance(refs, str) else set()


def seen_in_context(tasks: Iterable[TaskRecord], context: Sequence[Message]) -> list[TaskRecord]:
    """Tasks whose terminal fact is visible in ``context`` and still needs consumption.

    Visible means: its delivered notification, the tool result that reported its end, or a
    compaction handoff that carried its reference.
    """
    ids = {m.id for m in context}
    carried: set[str] = set()
    for message in context:
        carried |= handoff_task_ids(message)
    seen: list[TaskRecord] = []
    for task in tasks:
        if not needs_consumption(task):
            continue
        if task.terminal_reported is not None:
            visible = task.tool_result_id in ids
        else:
            visible = task.delivered and task.notification_id in ids
        told = task.delivered or task.terminal_reported is not None
        if visible or (task.task_id in carried and told):
            seen.append(task)
    return seen


def consumed(task: TaskRecord, *, now: float) -> TaskRecord:
    """The model step that saw the task succeeded (invariant 5)."""
    if task.consumed:
        return task
    if not needs_consumption(task) or not (task.delivered or task.terminal_reported):
        raise InvalidTransition(task.task_id, task.state, "consumed before it was delivered")
    return _replace(task, consumed=True, consumed_at=now, continuation_error=None)


def continuation_failed(task: TaskRecord, *, error: str) -> TaskRecord:
    """The model step failed: keep everything, remember why."""
    return _replace(task, continuation_error=error)


def settled(task: TaskRecord, *, now: float, keep_seconds: float) -> bool:
    """A task nothing will ever act on again, ended more than ``keep_seconds`` ago (retention)."""
    if not is_terminal(task) or needs_consumption(task) or eligible(task):
        return False
    return task.ended_at is not None and task.ended_at <= now - keep_seconds


def handoff_references(tasks: Iterable[TaskRecord]) -> list[TaskReference]:
    """References a compaction must carry: running tasks and unconsumed terminal facts."""
    refs = [
        TaskReference(
            task_id=t.task_id,
            state=t.state,
            command=t.command,
            event_id=t.event_id,
            exit_code=t.exit_code,
            signal=t.signal,
            delivered=t.delivered,
            consumed=t.consumed,
            notification_id=t.notification_id,
        )
        for t in tasks
        if is_active(t) or needs_consumption(t)
    ]
    return sorted(refs, key=lambda r: r.task_id)


# -- session control ---------------------------------------------------------------------------
class Decision(msgspec.Struct, frozen=True, kw_only=True):
    run: bool
    reason: str


def continuation_decision(
    control: SessionControl, *, busy: bool, pending: int, tool_call_open: bool = False
) -> Decision:
    """Whether an automatic turn may run now (invariant 6). Checked in this order.

    ``tool_call_open``: the conversation ends in a tool call still waiting for its result; a
    model step now would see a call without its result, so the host's tool loop goes first.
    """
    if busy:
        return Decision(run=False, reason="busy")
    if tool_call_open:
        return Decision(run=False, reason="tool_call_open")
    if control.interrupted:
        return Decision(run=False, reason="interrupted")
    if control.goal in ("paused", "blocked"):
        return Decision(run=False, reason=f"goal_{control.goal}")
    if control.awaiting_user:
        return Decision(run=False, reason="retries_exhausted")
    if pending <= 0:
        return Decision(run=False, reason="nothing_pending")
    return Decision(run=True, reason="pending_tasks")


def user_input(control: SessionControl, *, now: float) -> SessionControl:
    """New user input lifts interruption and the retry stop (a goal stays as it was set)."""
    return _replace(control, interrupted=False, awaiting_user=False, model_failures=0, updated_at=now)


def turn_began(control: SessionControl, *, now: float) -> SessionControl:
    """A turn that runs the tool loop started: a crash before :func:`turn_ended` leaves calls
    only this turn would have answered, and recovery closes them."""
    return _replace(control, turn_open=True, updated_at=now)


def turn_ended(control: SessionControl, *, now: float) -> SessionControl:
    return control if not control.turn_open else _replace(control, turn_open=False, updated_at=now)


def interrupted(control: SessionControl, *, now: float) -> SessionControl:
    return _replace(control, interrupted=True, updated_at=now)


def goal_set(control: SessionControl, goal: GoalState, *, now: float) -> SessionControl:
    return _replace(control, goal=goal, updated_at=now)


def turn_finished(
    control: SessionControl, *, error: str | None, max_model_failures: int, now: float
) -> SessionControl:
    """Count consecutive model failures; at the limit, stop until new user input."""
    if error is None:
        return _replace(control, model_failures=0, last_error=None, updated_at=now)
    failures = control.model_failures + 1
    return _replace(
        control,
        model_failures=failures,
        awaiting_user=control.awaiting_user or failures >= max_model_failures,
        last_error=error,
        updated_at=now,
    )

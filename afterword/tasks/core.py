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

The decisions live in three modules, all importable from here: process facts in
:mod:`.processes` (invariant 1), session control in :mod:`.control` (invariant 6), and the
tool-call, notification and consumption facts below (invariants 2-5).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from ..history import Message
from .control import (
    Decision,
    continuation_decision,
    goal_set,
    interrupted,
    turn_began,
    turn_ended,
    turn_finished,
    user_input,
)
from .errors import refused
from .processes import (
    HOST_STOPPED,
    LIFECYCLE,
    LOST_NEVER_RECORDED,
    LOST_UNSUPERVISED_EXIT,
    LOST_VANISHED,
    NOTIFICATION_PREFIX,
    ExitStatus,
    Outcome,
    ProbeResult,
    RecoveryAction,
    adopted,
    classify_exit,
    event_id_for,
    is_terminal,
    leftovers_stopped,
    new_task,
    notification_id_for,
    recorded_end,
    recovery_action,
    request_cancel,
    request_stop,
    request_timeout,
    signal_name,
    spawn_failure,
    spawned,
    task_file_fault,
    terminate,
    unsupervised_end,
)
from .records import TaskRecord, TaskReference

__all__ = [
    "HANDOFF_KIND",
    "HOST_STOPPED",
    "LIFECYCLE",
    "LOST_NEVER_RECORDED",
    "LOST_UNSUPERVISED_EXIT",
    "LOST_VANISHED",
    "NOTIFICATION_KIND",
    "NOTIFICATION_PREFIX",
    "Decision",
    "ExitStatus",
    "Outcome",
    "ProbeResult",
    "RecoveryAction",
    "adopted",
    "blockers",
    "cancelled",
    "classify_exit",
    "commit",
    "consumed",
    "continuation_decision",
    "continuation_failed",
    "deliverable",
    "delivered",
    "eligible",
    "event_id_for",
    "goal_set",
    "handoff_references",
    "handoff_task_ids",
    "interrupted",
    "is_active",
    "is_terminal",
    "leftovers_stopped",
    "needs_consumption",
    "new_task",
    "notification_id_for",
    "prepare_commit",
    "prepare_interrupted",
    "recorded_end",
    "recovery_action",
    "request_cancel",
    "request_stop",
    "request_timeout",
    "seen_in_context",
    "settled",
    "signal_name",
    "spawn_failure",
    "spawned",
    "task_file_fault",
    "terminate",
    "turn_began",
    "turn_ended",
    "turn_finished",
    "unsupervised_end",
    "user_input",
]

NOTIFICATION_KIND = "task_notification"
HANDOFF_KIND = "compaction_handoff"

_replace = msgspec.structs.replace


# -- tool-call facts ---------------------------------------------------------------------------
def prepare_commit(task: TaskRecord, *, tool_result_id: str, reported_terminal: bool) -> TaskRecord:
    """Decide, before the tool result is written, whether it hands the task off.

    ``reported_terminal`` means the tool result itself tells the model how the task ended; that
    task is not handed off and will get no separate notification (invariant 4).
    """
    if task.tool_result_id is not None:
        if task.tool_result_id != tool_result_id:
            raise refused(task.task_id, "tool result " + task.tool_result_id, "another tool result")
        return task
    if reported_terminal and task.event_id is None:
        raise refused(task.task_id, task.state, "terminal state reported before it exists")
    return _replace(
        task,
        tool_result_id=tool_result_id,
        handed_off=not reported_terminal,
        terminal_reported=task.event_id if reported_terminal else None,
    )


def prepare_interrupted(task: TaskRecord, *, tool_result_id: str) -> TaskRecord:
    """The call's own result never reached the conversation and a stand-in ("interrupted")
    answers it instead. Whatever the lost result was going to report, the stand-in reports
    nothing, so the task is handed off and its end gets a notification (decided from what was
    written, not from what was prepared)."""
    if task.committed:
        return task
    return _replace(task, tool_result_id=tool_result_id, handed_off=True, terminal_reported=None)


def commit(task: TaskRecord, *, now: float) -> TaskRecord:
    """The tool result is durable in the conversation (invariant 2)."""
    if task.tool_result_id is None:
        raise refused(task.task_id, "tool result not prepared", "committed")
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
        raise refused(task.task_id, task.state, "delivered with a foreign message id")
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
        raise refused(task.task_id, task.state, "consumed before it was delivered")
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

"""Durable records of the task journal (pure data, no I/O).

A ``TaskRecord`` holds three independent facts about one background command, each written by
a different actor at its own time:

* the process fact - ``state`` leaves ``running`` once, with ``event_id`` and the exit facts
  (``ProcessSupervisor``);
* the tool-call fact - ``committed``: the initial tool result that started the task is durable
  in the conversation, and whether it ``handed_off`` the task to the background or already
  reported its terminal state (``ToolCallProcessor``);
* the session facts - ``delivered`` (a notification message entered the conversation) and
  ``consumed`` (a model step that saw it succeeded) (``TaskNotifications``, ``TurnRunner``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

TaskState = Literal["running", "exited", "failed", "killed", "cancelled", "lost"]
NotifyPolicy = Literal["on_exit", "off"]
GoalState = Literal["none", "active", "paused", "blocked"]

TERMINAL_STATES: frozenset[str] = frozenset({"exited", "failed", "killed", "cancelled", "lost"})


class TaskRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One background task. Times are seconds since the epoch, passed in by the caller."""

    task_id: str
    session_id: str
    tool_call_id: str
    command: tuple[str, ...]
    cwd: str | None = None
    notify: NotifyPolicy = "on_exit"
    created_at: float
    output_path: str  # relative to the journal's state root

    # -- process facts (ProcessSupervisor) ----------------------------------------------------
    state: TaskState = "running"
    pid: int | None = None  # None while running: the supervisor never recorded a process
    process_identity: str | None = None  # boot id + start time: proves the pid is still ours
    started_at: float | None = None
    adopted: bool = False  # running under a later supervisor that cannot wait() for it
    cancel_requested: bool = False  # the user's cancel: the end is not notified
    stop_requested: bool = False  # the host stopped it while shutting down: the end is notified
    timeout_at: float | None = None  # stopped at this time if still running (per-task timeout)
    timed_out: bool = False  # the timeout stopped it: the end is notified as such
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None  # spawn failure, or why the fate is unknown (lost)
    output_bytes: int = 0  # everything the process printed, captured or not
    output_truncated: bool = False
    event_id: str | None = None  # assigned with the terminal state; stable forever

    # -- tool-call facts (ToolCallProcessor) ----------------------------------------------------
    tool_result_id: str | None = None  # the initial tool result message, once prepared
    handed_off: bool = False  # the tool result said the task continues in the background
    terminal_reported: str | None = None  # event id the tool result already reported
    committed: bool = False
    committed_at: float | None = None

    # -- session facts (TaskNotifications, TurnRunner) ------------------------------------------
    notification_id: str | None = None
    delivered: bool = False
    delivered_at: float | None = None
    consumed: bool = False
    consumed_at: float | None = None
    continuation_error: str | None = None


class SessionControl(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-session switches that gate automatic continuation (durable across restarts)."""

    session_id: str
    interrupted: bool = False
    goal: GoalState = "none"
    model_failures: int = 0  # consecutive failed model steps
    awaiting_user: bool = False  # model retries exhausted: only new user input resumes
    last_error: str | None = None
    turn_open: bool = False  # a coordinator turn (tool loop included) began and has not ended
    updated_at: float = 0.0


class TaskReference(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a compaction handoff carries about a task the model must not forget."""

    task_id: str
    state: TaskState
    command: tuple[str, ...]
    event_id: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    delivered: bool = False
    consumed: bool = False
    notification_id: str | None = None

"""Background task journal: process completion, notification delivery and model consumption
kept as three separate durable facts (spec: task-notifications)."""

from .compaction import Compaction
from .coordinator import ExecutionCoordinator, WakeResult
from .core import (
    HANDOFF_KIND,
    NOTIFICATION_KIND,
    Decision,
    Outcome,
    blockers,
    continuation_decision,
    eligible,
    event_id_for,
    handoff_references,
    notification_id_for,
)
from .errors import (
    CompactionRefused,
    InvalidTransition,
    SupervisorError,
    TaskError,
    TaskJournalCorrupt,
    UnknownTaskError,
)
from .events import SessionEvent
from .hostturn import HostTurn
from .journal import TaskJournal
from .notifications import FaultHook, TaskNotifications
from .records import (
    TERMINAL_STATES,
    GoalState,
    NotifyPolicy,
    SessionControl,
    TaskRecord,
    TaskReference,
    TaskState,
)
from .render import (
    NotificationBody,
    OutputChunk,
    OutputExcerpt,
    frame_output,
    parse_notification,
    render_notification,
)
from .runtime import TaskRuntime
from .supervisor import ProcessSupervisor
from .toolcalls import ToolCallProcessor
from .toolloop import ToolExecutor, ToolResult, TurnResult, tool_result_id
from .turns import ModelStep, TaskTurnHook, TurnOutcome, TurnRunner

__all__ = [
    "HANDOFF_KIND",
    "NOTIFICATION_KIND",
    "TERMINAL_STATES",
    "Compaction",
    "CompactionRefused",
    "Decision",
    "ExecutionCoordinator",
    "FaultHook",
    "GoalState",
    "HostTurn",
    "InvalidTransition",
    "ModelStep",
    "NotificationBody",
    "NotifyPolicy",
    "Outcome",
    "OutputChunk",
    "OutputExcerpt",
    "ProcessSupervisor",
    "SessionControl",
    "SessionEvent",
    "SupervisorError",
    "TaskError",
    "TaskJournal",
    "TaskJournalCorrupt",
    "TaskNotifications",
    "TaskRecord",
    "TaskReference",
    "TaskRuntime",
    "TaskState",
    "TaskTurnHook",
    "ToolCallProcessor",
    "ToolExecutor",
    "ToolResult",
    "TurnOutcome",
    "TurnResult",
    "TurnRunner",
    "UnknownTaskError",
    "WakeResult",
    "blockers",
    "continuation_decision",
    "eligible",
    "event_id_for",
    "frame_output",
    "handoff_references",
    "notification_id_for",
    "parse_notification",
    "render_notification",
    "tool_result_id",
]

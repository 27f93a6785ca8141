"""Errors of the task journal. Each says whose fault it is.

* ``InvalidTransition`` - a caller asked for a lifecycle or delivery step the record's current
  state forbids (the caller's fault; nothing was written). It is the continuation core's class
  (:class:`afterword.continuations.errors.InvalidTransition`), raised with ``subject="task <id>"``:
  one name for one idea across both lifecycles.
* ``UnknownTaskError`` - no task with that id (the caller's fault).
* ``TaskJournalCorrupt`` - a stored task record cannot be decoded (the state on disk's fault).
* ``SupervisorError`` - the supervisor was used outside its lifetime (the caller's fault).
* ``CompactionRefused`` - a compaction handoff was asked for while a tool call of the session
  waits for its result (the caller's fault; nothing was written).
"""

from __future__ import annotations

from ..continuations.errors import InvalidTransition
from ..errors import AfterwordError, CallerError, StateError

__all__ = [
    "CompactionRefused",
    "InvalidTransition",
    "SupervisorError",
    "TaskError",
    "TaskJournalCorrupt",
    "UnknownTaskError",
    "refused",
]


class TaskError(AfterwordError):
    """Base of every error raised by ``afterword.tasks``."""


def refused(task_id: str, state: str, step: str) -> InvalidTransition:
    """The error for a task-journal step that ``state`` forbids."""
    return InvalidTransition(state, step, subject=f"task {task_id}")


class UnknownTaskError(TaskError, CallerError, KeyError):
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(task_id)

    def __str__(self) -> str:
        return f"no task {self.task_id!r}"


class TaskJournalCorrupt(TaskError, StateError):
    """A stored task or session-control record is unreadable (fail closed)."""


class SupervisorError(TaskError, CallerError):
    """The process supervisor is not running (enter it with ``async with``)."""


class CompactionRefused(TaskError, CallerError):
    """A handoff now would land between a tool call and its result; answer the call first."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r} has a tool call waiting for its result; a compaction "
            "handoff now would split the call from its result"
        )

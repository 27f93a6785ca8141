"""When a task-backed continuation owes its MCP server a ``tasks/cancel`` (pure).

Kept apart from :mod:`.taskoutcomes` so the lifecycle (an expiry) and the operator's verbs can
mark it without importing the outcome table.
"""

from __future__ import annotations

import msgspec

from .model import Continuation, TaskBacking

TERMINAL_TASK = frozenset({"completed", "failed", "cancelled"})


def request_cancel(rec: Continuation) -> Continuation:
    """``rec`` (just cancelled or expired) with ``tasks/cancel`` owed when its task may still
    run; any other record unchanged. Durable with the cancel itself, before anything is sent."""
    task = rec.task
    if task is None or task.cancel_requested or task.status in TERMINAL_TASK:
        return rec
    return msgspec.structs.replace(rec, task=msgspec.structs.replace(task, cancel_requested=True))


def owes_cancel(task: TaskBacking | None) -> bool:
    """``tasks/cancel`` is owed and nobody has recorded sending it yet."""
    return task is not None and task.cancel_requested and task.cancel_sent_at_ms is None

"""Reading the MCP Tasks wire on the host side: a task handle and a ``tasks/get`` answer.

Only the fields afterword uses are read, each checked; a server that breaks one gets a
:class:`MalformedTask` whose message names the field and never echoes its value (a task id
may be a bearer secret, and anything else may be hostile text).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from typing import Any

from ..continuations.errors import InvalidRequest
from ..errors import RemoteError
from ..protocol.tasks import MAX_TASK_ID as TASK_ID_MAX
from ..protocol.tasks import MAX_TASK_MESSAGE as MESSAGE_MAX
from ..protocol.tasks import TASK_STATUSES as _TASK_STATES
from ..protocol.tasks import TaskHandle, TaskOutcome, check_handle

__all__ = ["MalformedTask", "accepted_text", "read_handle", "read_outcome"]


class MalformedTask(RemoteError):
    """A task handle or a ``tasks/get`` answer that breaks the protocol (the server's fault).
    The message names the field, never its value."""


def _task_id(raw: Mapping[str, Any], where: str) -> str:
    task_id = raw.get("taskId")
    if not isinstance(task_id, str) or not 1 <= len(task_id) <= TASK_ID_MAX:
        raise MalformedTask(f"{where}: taskId must be a string of 1-{TASK_ID_MAX} characters")
    if any(unicodedata.category(ch) == "Cc" for ch in task_id):
        raise MalformedTask(f"{where}: taskId holds a control character")
    return task_id


def _status(raw: Mapping[str, Any], where: str) -> str:
    status = raw.get("status")
    if status not in _TASK_STATES:
        raise MalformedTask(f"{where}: status must be one of {', '.join(_TASK_STATES)}")
    assert isinstance(status, str)
    return status


def _millis(raw: Mapping[str, Any], key: str, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise MalformedTask(f"{where}: {key} must be a non-negative number of milliseconds")
    return min(int(value), 2**53)


def read_handle(raw: Mapping[str, Any]) -> TaskHandle:
    """The handle a ``tools/call`` answered with, checked; raises :class:`MalformedTask`."""
    where = "task handle"
    handle = TaskHandle(
        task_id=_task_id(raw, where),
        status=_status(raw, where),  # type: ignore[arg-type]
        poll_interval_ms=_millis(raw, "pollIntervalMs", where),
        ttl_ms=_millis(raw, "ttlMs", where),
    )
    try:
        # The service's own rule too, so the host never hands over what adoption would refuse
        # (the checks above are there to name the field for the model).
        check_handle(handle)
    except InvalidRequest as exc:
        raise MalformedTask(f"{where}: {exc}") from None
    return handle


def _bounded(text: str) -> str:
    data = text.encode("utf-8")
    return text if len(data) <= MESSAGE_MAX else data[:MESSAGE_MAX].decode("utf-8", "ignore")


def read_outcome(raw: Mapping[str, Any], task_id: str) -> TaskOutcome:
    """A ``tasks/get`` answer as the outcome to report; raises :class:`MalformedTask` when it
    names another task, lacks the result of a completed task, or breaks a field's type."""
    where = "tasks/get answer"
    if _task_id(raw, where) != task_id:
        raise MalformedTask(f"{where}: taskId is not the task asked for")
    status = _status(raw, where)
    poll = _millis(raw, "pollIntervalMs", where)
    message = raw.get("statusMessage")
    message = _bounded(message) if isinstance(message, str) else None
    if status == "completed":
        result = raw.get("result")
        if not isinstance(result, dict) or not isinstance(result.get("content", []), list):
            raise MalformedTask(f"{where}: a completed task needs a CallToolResult object in result")
        return TaskOutcome(status="completed", result=result, message=message, poll_interval_ms=poll)
    if status == "failed":
        error = raw.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = _bounded(error["message"])
        return TaskOutcome(status="failed", message=message or "the task failed", poll_interval_ms=poll)
    return TaskOutcome(status=status, message=message, poll_interval_ms=poll)  # type: ignore[arg-type]


def accepted_text(tool: str, continuation_id: str) -> str:
    """What the model reads when a tool call became a continuation."""
    return (
        f"Accepted: {tool} is running as a background task (continuation {continuation_id}). "
        "Its answer will follow in this conversation when it finishes; there is nothing to wait "
        "for or poll now."
    )

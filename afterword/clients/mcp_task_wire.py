"""Reading the MCP Tasks wire on the host side: a task handle (a ``tasks/get`` answer is read
by :mod:`afterword.protocol.taskanswers`, the one reader the service's follower uses too).

Only the fields afterword uses are read, each checked; a server that breaks one gets a
:class:`MalformedTask` whose message names the field and never echoes its value (a task id
may be a bearer secret, and anything else may be hostile text).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from typing import Any

import msgspec

from ..continuations.errors import InvalidRequest
from ..errors import RemoteError
from ..protocol.taskanswers import Malformed, Polled, answer_from_result
from ..protocol.tasks import MAX_TASK_ID as TASK_ID_MAX
from ..protocol.tasks import MAX_TASK_MESSAGE as MESSAGE_MAX
from ..protocol.tasks import TASK_STATUSES as _TASK_STATES
from ..protocol.tasks import TaskHandle, TaskOutcome, check_handle

__all__ = ["MalformedTask", "accepted_text", "bounded", "outcome_of", "read_handle"]


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


def bounded(text: str) -> str:
    """``text`` cut to what a reported message may hold (1 KiB of UTF-8)."""
    data = text.encode("utf-8")
    return text if len(data) <= MESSAGE_MAX else data[:MESSAGE_MAX].decode("utf-8", "ignore")


def outcome_of(raw: Any, task_id: str, secrets: tuple[str, ...] = ()) -> TaskOutcome:
    """The one reader's verdict (protocol/taskanswers.py) as the host's follower acts on it,
    cleaned of ``secrets``: an answer that breaks the protocol raises :class:`MalformedTask`."""
    answer = answer_from_result(raw, task_id)
    if isinstance(answer, Malformed):
        raise MalformedTask(answer.detail)
    assert isinstance(answer, Polled)  # the reader of a result answers nothing else
    return _scrubbed(answer.outcome, secrets)


def _scrub(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, "[redacted]")
        return value
    if isinstance(value, dict):
        return {key: _scrub(item, secrets) for key, item in value.items()}
    if isinstance(value, list):
        return [_scrub(item, secrets) for item in value]
    return value


def _scrubbed(outcome: TaskOutcome, secrets: tuple[str, ...]) -> TaskOutcome:
    """``outcome`` without any of ``secrets``: a server that echoes the claim token it was
    handed must not get it into the record, the trail or the user's answer."""
    secrets = tuple(secret for secret in secrets if secret)
    if not secrets or not any(secret in msgspec.json.encode(outcome).decode() for secret in secrets):
        return outcome
    return msgspec.structs.replace(
        outcome, message=_scrub(outcome.message, secrets), result=_scrub(outcome.result, secrets)
    )


def accepted_text(tool: str, continuation_id: str) -> str:
    """What the model reads when a tool call became a continuation."""
    return (
        f"Accepted: {tool} is running as a background task (continuation {continuation_id}). "
        "Its answer will follow in this conversation when it finishes; there is nothing to wait "
        "for or poll now."
    )

"""What one ``tasks/get`` poll told the follower, read without trusting the server.

The MCP SDK speaks the JSON-RPC; this module only judges the answer it hands back: a task
state (an :class:`~afterword.protocol.tasks.TaskOutcome` for the service's outcome table), the
server saying it does not know the task (``lost``), an answer that breaks the protocol (a
failed poll), or no answer at all (the server is unreachable). No I/O and no SDK import, so
the judgement is testable on any SDK line. It is the one reader of a ``tasks/get`` answer:
the service's follower and the host's (``clients/mcp_tasks.py``) both call
:func:`answer_from_result`, so both judge the same answer the same way.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import msgspec

from .tasks import MAX_TASK_ID, TaskOutcome

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Answer",
    "AnswerOverCap",
    "Malformed",
    "Polled",
    "Unknown",
    "Unreachable",
    "answer_from_error",
    "answer_from_result",
    "clip",
    "scrub",
    "scrub_text",
    "secrets_of",
]

MAX_MESSAGE_BYTES = 1024
# JSON-RPC codes (the SDK's mcp_types names them; repeated here so this module needs no SDK).
INVALID_PARAMS = -32602  # SEP-2663 servers answer an unknown, expired or foreign task id so
CONNECTION_CLOSED = -32000
REQUEST_TIMEOUT = -32001
INTERNAL_ERROR = -32603  # also the SDK's stand-in for an HTTP 5xx: the server is up but failing
TRANSIENT_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT, INTERNAL_ERROR})


@dataclass(frozen=True)
class Polled:
    """A well-formed answer about our task."""

    outcome: TaskOutcome


@dataclass(frozen=True)
class Unknown:
    """The server says it does not know the task (it lost its state, or the id expired)."""

    message: str


@dataclass(frozen=True)
class Malformed:
    """An answer that breaks the protocol: counted as a failed poll."""

    detail: str


@dataclass(frozen=True)
class Unreachable:
    """No answer (refused, reset, timed out, 5xx): retried with backoff until the deadline."""

    detail: str


@dataclass(frozen=True)
class AnswerOverCap:
    """The answer was longer than the follower reads; reading stopped at ``limit`` bytes."""

    limit: int


Answer = Polled | Unknown | Malformed | Unreachable | AnswerOverCap


class _Task(msgspec.Struct, kw_only=True, rename="camel"):
    # Unknown fields (createdAt, _meta, ...) are the server's business: not forbidden here.
    task_id: str
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    status_message: str | None = None
    poll_interval_ms: int | float | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


def clip(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, on a character boundary."""
    data = text.encode("utf-8", "replace")  # a lone surrogate (JSON allows one) becomes "?"
    if len(data) <= limit:
        return data.decode("utf-8")
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


def _interval(value: int | float | None) -> int | None:
    if value is None:
        return None
    return int(min(value, 2**53))


def _broken(task: _Task) -> str | None:
    """What the schema cannot say about a field, named without its value (a task id may be a
    bearer secret, and the rest may be hostile text); None when the answer is well-formed."""
    if not 1 <= len(task.task_id) <= MAX_TASK_ID or any(
        unicodedata.category(ch) == "Cc" for ch in task.task_id
    ):
        return f"taskId must be 1-{MAX_TASK_ID} characters with no control character"
    value = task.poll_interval_ms
    if value is not None and (not math.isfinite(value) or value < 0):
        return "pollIntervalMs must be a non-negative number of milliseconds"
    if task.result is not None:
        if not isinstance(task.result.get("content", []), list):
            return "result.content must be a list"
        # A string "true" read as success would hand the model a failure as an answer.
        if not isinstance(task.result.get("isError", False), bool):
            return "result.isError must be a boolean"
    return None


def _failure_message(task: _Task) -> str:
    if task.error is not None and isinstance(task.error.get("message"), str) and task.error["message"]:
        return clip(task.error["message"])
    if task.status_message:
        return clip(task.status_message)
    return "the task failed"


def answer_from_result(raw: Any, task_id: str) -> Answer:
    """Judge a ``tasks/get`` result (the decoded JSON object) for the task ``task_id``."""
    try:
        task = msgspec.convert(raw, _Task)
    except msgspec.ValidationError as exc:
        return Malformed(clip(f"tasks/get answer does not match the tasks schema: {exc}", 200))
    if task.task_id != task_id:
        return Malformed("tasks/get answered about a different task id")
    broken = _broken(task)
    if broken is not None:
        return Malformed(f"tasks/get answer: {broken}")
    interval = _interval(task.poll_interval_ms)
    if task.status == "completed":
        if task.result is None:
            return Malformed("a completed task's answer carries no result")
        return Polled(TaskOutcome(status="completed", result=task.result, poll_interval_ms=interval))
    if task.status == "failed":
        return Polled(
            TaskOutcome(
                status="failed", result=task.result, message=_failure_message(task), poll_interval_ms=interval
            )
        )
    message = clip(task.status_message) if task.status_message else None
    return Polled(TaskOutcome(status=task.status, message=message, poll_interval_ms=interval))


def answer_from_error(code: int, message: str) -> Answer:
    """Judge a JSON-RPC error the SDK raised for ``tasks/get``."""
    if code == INVALID_PARAMS:
        return Unknown(clip(message or "the server does not know this task"))
    if code in TRANSIENT_CODES:
        return Unreachable(clip(f"error {code}: {message}", 200))
    return Malformed(clip(f"tasks/get refused with error {code}: {message}", 200))


REDACTED = "[redacted]"


def secrets_of(headers: Mapping[str, str]) -> tuple[str, ...]:
    """What a server must not get afterword to repeat: each configured header value, and each
    long word of one (the token of ``Bearer <token>``), longest first."""
    found = {v for v in headers.values() if len(v) >= 4}
    found |= {w for v in headers.values() for w in v.split() if len(w) >= 8}
    return tuple(sorted(found, key=len, reverse=True))


def scrub_text(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def scrub(answer: Answer, secrets: tuple[str, ...]) -> Answer:
    """``answer`` with the server's words cleaned of ``secrets`` (a hostile server may echo the
    headers it was sent into its messages, which afterword logs and records)."""
    if not secrets:
        return answer
    if isinstance(answer, Polled):
        message = answer.outcome.message
        if message is None:
            return answer
        return Polled(msgspec.structs.replace(answer.outcome, message=clip(scrub_text(message, secrets))))
    if isinstance(answer, Unknown):
        return Unknown(clip(scrub_text(answer.message, secrets)))
    if isinstance(answer, (Malformed, Unreachable)):
        return replace(answer, detail=clip(scrub_text(answer.detail, secrets)))
    return answer

"""Wire and record types of the MCP Tasks bridge (docs/tasks-bridge.md).

A tool call of a selected server may be answered with a task handle instead of a result
(``io.modelcontextprotocol/tasks``). The host adopts the handle as a task-backed continuation
(:class:`TaskHandle` in, :class:`AdoptedTask` out), and whoever follows the task hands each
answer of ``tasks/get`` to the service as a :class:`TaskOutcome` (:class:`TaskReport` back).

Inputs forbid unknown fields and are bounded here; :func:`check_handle` and
:func:`check_outcome` are the full rules, applied on every path (embedded and HTTP), since an
embedded caller builds the Structs without decoding them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

import msgspec

from ..continuations.errors import InvalidRequest

__all__ = [
    "MAX_HINT_MS",
    "MAX_TASK_ID",
    "MAX_TASK_MESSAGE",
    "OUTCOME_STATUSES",
    "TASK_STATUSES",
    "AdoptTaskRequest",
    "AdoptedTask",
    "Follow",
    "OutcomeStatus",
    "TaskHandle",
    "TaskOutcome",
    "TaskReport",
    "TaskStatus",
    "check_handle",
    "check_outcome",
    "decode_handle",
    "decode_outcome",
]

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
TASK_STATUSES: tuple[TaskStatus, ...] = get_args(TaskStatus)
# ``lost``: the server answered tasks/get with an error saying it does not know the task.
# ``protocol_error``: the follower saw malformed answers (or a wrong task id) too many times
# in a row; it reports this once it gives up. ``too_large``: the answer was too large for
# the follower to read at all (see docs/tasks-bridge.md).
OutcomeStatus = Literal[
    "working", "input_required", "completed", "failed", "cancelled", "lost", "protocol_error", "too_large"
]
OUTCOME_STATUSES: tuple[OutcomeStatus, ...] = get_args(OutcomeStatus)
Follow = Literal["service", "host"]

MAX_TASK_ID = 256
MAX_TASK_MESSAGE = 1024  # bytes of UTF-8
# The largest hint kept: the largest integer a JSON number holds exactly (285,000 years of
# milliseconds). A bigger one cannot be stored in a record (msgpack stops at 2^64 - 1), and
# the host helpers clamp what a server says to it before handing a handle over.
MAX_HINT_MS = 2**53
# A task id is server-made: any text without control characters (C0, DEL, C1), bounded.
TASK_ID_PATTERN = "[^\\x00-\\x1f\\x7f-\\x9f]"
_TASK_ID_RE = re.compile(f"{TASK_ID_PATTERN}{{1,{MAX_TASK_ID}}}")

TaskId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_TASK_ID,
        pattern=f"^{TASK_ID_PATTERN}+$",
        description=f"the server's task id: 1-{MAX_TASK_ID} characters without control characters",
    ),
]
Hint = Annotated[int, msgspec.Meta(ge=0, le=MAX_HINT_MS, description="milliseconds, as the server hinted")]
Message = Annotated[str, msgspec.Meta(max_length=MAX_TASK_MESSAGE)]
ServerName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class TaskHandle(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """What the server answered ``tools/call`` with (``resultType: "task"``), as the host read
    it. The hints are kept as given and clamped where used (a hostile 0 or 10^9 is harmless)."""

    task_id: TaskId
    status: TaskStatus
    poll_interval_ms: Hint | None = None
    ttl_ms: Hint | None = None


class AdoptTaskRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """``POST /v1/host/runs/{runId}/tasks``: a handle of one of the run's selected servers."""

    server: ServerName
    task_id: TaskId
    status: TaskStatus
    poll_interval_ms: Hint | None = None
    ttl_ms: Hint | None = None

    def handle(self) -> TaskHandle:
        return TaskHandle(
            task_id=self.task_id,
            status=self.status,
            poll_interval_ms=self.poll_interval_ms,
            ttl_ms=self.ttl_ms,
        )


class AdoptedTask(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The continuation a task became, and who polls it: ``service`` (afterword, for a
    loopback streamable-HTTP server) or ``host`` (a stdio server, which lives with the host)."""

    continuation_id: str
    follow: Follow


class TaskOutcome(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """One answer of ``tasks/get`` (or the lack of one), as the follower saw it.

    ``result`` is the ``CallToolResult`` wire object (``content``, ``structuredContent``,
    ``isError``) for ``completed`` and ``failed``; ``message`` says why for ``failed``,
    ``lost`` and ``protocol_error``."""

    status: OutcomeStatus
    result: dict[str, Any] | None = None
    message: Message | None = None
    poll_interval_ms: Hint | None = None


class TaskReport(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a report: the continuation's state now, and whether the reporter should
    send ``tasks/cancel`` (the continuation was cancelled, or the task asked for input)."""

    state: str
    cancel: bool


_handle_dec = msgspec.json.Decoder(TaskHandle)
_outcome_dec = msgspec.json.Decoder(TaskOutcome)


def _invalid(what: str, exc: Exception) -> InvalidRequest:
    if isinstance(exc, msgspec.ValidationError):
        return InvalidRequest(f"invalid {what}: {exc}")
    return InvalidRequest(f"{what} is not valid JSON")


def decode_handle(data: bytes) -> TaskHandle:
    try:
        handle = _handle_dec.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _invalid("task handle", exc) from None
    check_handle(handle)
    return handle


def decode_outcome(data: bytes) -> TaskOutcome:
    try:
        outcome = _outcome_dec.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _invalid("task outcome", exc) from None
    check_outcome(outcome)
    return outcome


def _check_hint(name: str, value: object) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_HINT_MS
    ):
        raise InvalidRequest(f"{name} must be an integer of milliseconds from 0 to 2^53")


def _unicode(text: str) -> bool:
    """Whether ``text`` can be stored: a lone surrogate (which JSON cannot carry but a
    Python caller can build) has no UTF-8 form, and would fail the record's commit."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_handle(handle: TaskHandle) -> None:
    """The rules of a handle, whoever built it. Raises :class:`InvalidRequest`."""
    if not isinstance(handle, TaskHandle):
        raise InvalidRequest("a task handle is required")
    if (
        not isinstance(handle.task_id, str)
        or not _TASK_ID_RE.fullmatch(handle.task_id)
        or not _unicode(handle.task_id)
    ):
        raise InvalidRequest(f"taskId must be 1-{MAX_TASK_ID} characters without control characters")
    if handle.status not in TASK_STATUSES:
        raise InvalidRequest("status must be one of " + ", ".join(TASK_STATUSES))
    _check_hint("pollIntervalMs", handle.poll_interval_ms)
    _check_hint("ttlMs", handle.ttl_ms)


def check_outcome(outcome: TaskOutcome) -> None:
    """The rules of an outcome, whoever built it. Raises :class:`InvalidRequest`. The size of
    a result is not refused here: an oversized one is an outcome of its own
    (``task_result_too_large``, :mod:`afterword.continuations.taskoutcomes`)."""
    if not isinstance(outcome, TaskOutcome):
        raise InvalidRequest("a task outcome is required")
    if outcome.status not in OUTCOME_STATUSES:
        raise InvalidRequest("status must be one of " + ", ".join(OUTCOME_STATUSES))
    if outcome.message is not None:
        if not isinstance(outcome.message, str) or not _unicode(outcome.message):
            raise InvalidRequest("message must be a string of Unicode text")
        if len(outcome.message.encode("utf-8")) > MAX_TASK_MESSAGE:
            raise InvalidRequest(f"message must be at most {MAX_TASK_MESSAGE} bytes")
    if outcome.result is not None and not isinstance(outcome.result, dict):
        raise InvalidRequest("result must be a CallToolResult object")
    if outcome.status == "completed" and outcome.result is None:
        raise InvalidRequest("a completed task's outcome carries its result")
    _check_hint("pollIntervalMs", outcome.poll_interval_ms)

"""The MCP Tasks bridge's outcome table as pure functions (docs/tasks-bridge.md).

A task-backed continuation (``Continuation.task``) is answered by its MCP server's task, not by
a producer's PUT. Whoever follows the task hands every answer of ``tasks/get`` over as a
:class:`~afterword.protocol.tasks.TaskOutcome`; :func:`decide` says what it means for the
record, :func:`sized` applies the result size limit once the payload's canonical bytes are
known, and :func:`apply` makes the new record. Nothing here reads a clock or does I/O.

========================  ===================================================  ======================
task says                 the record                                           cause shown
========================  ===================================================  ======================
``working``               unchanged (the host's lease is renewed)              -
``completed``             a result: ``structuredContent`` if an object, else   -
                          ``{"text": joined text content}``
``completed`` + isError,  a result ``{"taskFailed": true, "message": ...}``    ``task_failed``
or ``failed``             so the answer tells the user it failed
``cancelled``             cancelled                                            ``task_cancelled``
``input_required``        dead-lettered, ``tasks/cancel`` owed (one commit)    ``task_input_required``
``lost``                  dead-lettered                                        ``task_lost``
``protocol_error``        dead-lettered                                        ``task_protocol_error``
result over the limit,    dead-lettered                                        ``task_result_too_large``
or ``too_large``
no host report in lease   dead-lettered (follow ``host`` only)                 ``task_host_gone``
========================  ===================================================  ======================

An outcome for a record that already left ``claimed`` (or passed its deadline, which the
worker turns into ``expired``) changes nothing: the first outcome that ended the wait wins.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec

from .guards import move, terminate
from .lifecycle import dead_letter, submit_result
from .model import Continuation, ErrorInfo, ResultRecord
from .taskcancel import owes_cancel, request_cancel

__all__ = [
    "MAX_POLL_MS",
    "MIN_POLL_MS",
    "TaskDecision",
    "apply",
    "decide",
    "failure_payload",
    "host_gone",
    "idempotency_key",
    "owes_cancel",
    "poll_delay_ms",
    "record_cancel_sent",
    "request_cancel",
    "sized",
    "task_payload",
]

MIN_POLL_MS = 250
MAX_POLL_MS = 60_000
DEFAULT_POLL_MS = 1_000
MAX_FAILURE_MESSAGE = 1024
DecisionKind = Literal["ignore", "working", "accept", "cancel", "dead_letter"]


class TaskDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What an outcome does to a record. ``accept`` carries the payload to accept (``failed``
    marks a payload that reports the task's failure); ``cancel`` and ``dead_letter`` carry the
    cause; ``owes_cancel`` means ``tasks/cancel`` must be sent once this is durable."""

    kind: DecisionKind
    status: str | None = None
    payload: dict[str, Any] | None = None
    failed: bool = False
    code: str | None = None
    message: str | None = None
    owes_cancel: bool = False


IGNORE = TaskDecision(kind="ignore")


class TaskOutcome(Protocol):
    """What the table reads of an outcome (``afterword.protocol.tasks.TaskOutcome``, the wire
    type, has these fields; the core does not import the protocol layer)."""

    @property
    def status(self) -> str: ...

    @property
    def result(self) -> dict[str, Any] | None: ...

    @property
    def message(self) -> str | None: ...


def poll_delay_ms(hint: int | None, failures: int = 0) -> int:
    """When to poll next: the server's hint clamped to [250 ms, 60 s] (a hostile 0 or 10^9 is
    harmless), doubled per consecutive failed poll, never past 60 s."""
    base = DEFAULT_POLL_MS if hint is None else min(MAX_POLL_MS, max(MIN_POLL_MS, hint))
    return min(MAX_POLL_MS, base << min(max(0, failures), 16))


def idempotency_key(task_id: str) -> str:
    """The accepted result's idempotency key: one result per task."""
    return "task:" + task_id


def _text(result: dict[str, Any]) -> str:
    content = result.get("content")
    if not isinstance(content, list):
        return ""
    parts = [
        item["text"]
        for item in content
        if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str)
    ]
    return "\n".join(parts)


def task_payload(result: dict[str, Any]) -> dict[str, Any]:
    """The payload of a completed task's ``CallToolResult``: its structured content when that
    is an object, else its text content joined by newlines."""
    structured = result.get("structuredContent")
    if isinstance(structured, dict):
        return structured
    return {"text": _text(result)}


def _bounded(text: str) -> str:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_FAILURE_MESSAGE:
        return text
    return data[:MAX_FAILURE_MESSAGE].decode("utf-8", "ignore")


def failure_payload(outcome: TaskOutcome) -> dict[str, Any]:
    """The payload that tells the user the task failed: the reporter's message, else the
    tool's own error text, bounded."""
    message = outcome.message
    if not message and outcome.result is not None:
        message = _text(outcome.result)
    return {"taskFailed": True, "message": _bounded(message or "the task failed")}


def decide(rec: Continuation, outcome: TaskOutcome, now_ms: int) -> TaskDecision:
    """What ``outcome`` does to the task-backed record ``rec`` (see the table above)."""
    if rec.task is None or rec.state != "claimed" or now_ms > rec.claim.deadline_ms:
        return IGNORE  # ended (or past its deadline, to expire): a late outcome changes nothing
    status = outcome.status
    if status == "working":
        return TaskDecision(kind="working", status=status)
    if status == "completed" and outcome.result is not None and outcome.result.get("isError") is not True:
        return TaskDecision(kind="accept", status=status, payload=task_payload(outcome.result))
    if status in ("completed", "failed"):
        return TaskDecision(kind="accept", status=status, payload=failure_payload(outcome), failed=True)
    if status == "cancelled":
        return TaskDecision(
            kind="cancel", status=status, code="task_cancelled", message="the MCP server cancelled the task"
        )
    if status == "input_required":
        return TaskDecision(
            kind="dead_letter",
            status=status,
            code="task_input_required",
            message="the task asked for input, which nobody can give inside a continuation; it is cancelled",
            owes_cancel=True,
        )
    if status == "lost":
        why = outcome.message or "the server does not know the task (it lost its state)"
        return TaskDecision(kind="dead_letter", status=status, code="task_lost", message=why)
    if status == "too_large":
        why = outcome.message or "the task's answer was too large for its follower to read"
        return TaskDecision(kind="dead_letter", status=status, code="task_result_too_large", message=why)
    why = outcome.message or "the server kept answering tasks/get with malformed results"
    return TaskDecision(kind="dead_letter", status=status, code="task_protocol_error", message=why)


def sized(decision: TaskDecision, payload_bytes: int, limit: int) -> TaskDecision:
    """``decision`` once its payload's canonical size is known: over ``limit`` it becomes a
    dead letter (``task_result_too_large``)."""
    if decision.kind != "accept" or payload_bytes <= limit:
        return decision
    return TaskDecision(
        kind="dead_letter",
        status=decision.status,
        code="task_result_too_large",
        message=f"the task's result is {payload_bytes} bytes, over the {limit} byte result limit",
    )


def _with_task(rec: Continuation, **changes: Any) -> Continuation:
    assert rec.task is not None
    return msgspec.structs.replace(rec, task=msgspec.structs.replace(rec.task, **changes))


def apply(
    rec: Continuation, decision: TaskDecision, now_ms: int, result: ResultRecord | None = None
) -> Continuation | None:
    """The record after ``decision`` (None: nothing durable changes). ``accept`` needs the
    :class:`ResultRecord` built from the payload (its bytes and hash are the app's work)."""
    if decision.kind in ("ignore", "working") or rec.task is None:
        return None
    if decision.kind == "accept":
        assert result is not None
        accepted = submit_result(rec, result, now_ms)
        if accepted is None:
            return None
        if decision.failed:
            error = ErrorInfo.bounded("task_failed", (decision.payload or {}).get("message", ""))
            accepted = msgspec.structs.replace(accepted, last_error=error)
        return _with_task(accepted, status=decision.status, reported_at_ms=now_ms)
    code = decision.code or "task_protocol_error"
    if decision.kind == "cancel":
        ended = terminate(
            rec, move(rec, "cancel"), now_ms, last_error=ErrorInfo.bounded(code, decision.message or "")
        )
    else:
        ended = dead_letter(rec, code, decision.message or "", now_ms)
    return _with_task(
        ended,
        status=decision.status or rec.task.status,
        reported_at_ms=now_ms,
        cancel_requested=rec.task.cancel_requested or decision.owes_cancel,
    )


def record_cancel_sent(rec: Continuation, ok: bool, detail: str | None, now_ms: int) -> Continuation | None:
    """The sender's record of its ``tasks/cancel`` (None: nothing owed, nothing changes). A
    failure is kept for the operator; it never undoes the cancel."""
    if not owes_cancel(rec.task):
        return None
    return _with_task(
        msgspec.structs.replace(rec, updated_at_ms=now_ms),
        cancel_sent_at_ms=now_ms,
        cancel_ok=ok,
        cancel_detail=None if detail is None else _bounded(detail)[:512],
    )


def host_gone(rec: Continuation, lease_until_ms: int, now_ms: int) -> Continuation | None:
    """A host-followed task whose host made no report before ``lease_until_ms``: dead-lettered
    ``task_host_gone`` (None: the lease holds, or the record no longer waits on its task)."""
    task = rec.task
    if task is None or task.follow != "host" or rec.state != "claimed" or now_ms < lease_until_ms:
        return None
    return dead_letter(
        rec,
        "task_host_gone",
        "the host following this task stopped reporting before the task ended (its session is gone)",
        now_ms,
    )

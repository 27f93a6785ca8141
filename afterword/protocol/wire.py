"""Wire bodies of the HTTP protocol (camelCase JSON). Inputs forbid unknown fields, so a
request that tries to name a channel, a callback URL or a conversation is rejected."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

PayloadHash = Annotated[
    str,
    msgspec.Meta(
        description="lowercase hex sha256 of the payload's RFC 8785 (JSON Canonicalization Scheme) "
        "canonical JSON; the older msgspec sorted compact form of the same payload is accepted too "
        "(docs/payload-hash.md; `afterword payload-hash` prints it)"
    ),
]


class ClaimRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    task_key: str
    task_hash: str
    deadline: str


class DetachedClaimRequest(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    route: str
    task_key: str
    task_hash: str
    deadline: str


class ResultRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    idempotency_key: str
    payload_hash: PayloadHash
    payload: Any


class ClaimResponse(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    continuation_id: str
    result_url: str
    status_url: str
    result_token: str
    expires_at: str
    fingerprint: str


class AttemptsBody(msgspec.Struct, frozen=True, kw_only=True):
    synthesis: int
    delivery: int


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str


class ReceiptBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    kind: str
    delivered_at: str
    channel_id: str | None
    delivery_ids: tuple[str, ...]
    history_recorded: bool
    history_error_code: str | None


class StatusBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    continuation_id: str
    state: str
    origin_context: str
    mode: str
    kind: str
    attempts: AttemptsBody
    last_error: ErrorDetail | None
    receipt: ReceiptBody | None
    completion_kind: str | None
    deferred: bool
    expires_at: str
    created_at: str
    updated_at: str
    compacted: bool = False
    # Compacted records: ``originContext`` says "scrubbed" (the snapshot is gone); this is the
    # context it had before, so that compaction is not read as a lost origin.
    origin_context_at_compaction: str | None = None
    post_unproven: bool = False  # an earlier post's outcome was never proven (sticky)
    acknowledged_at: str | None = None
    # delivery_retry only: when the next automatic attempt is due; ``held`` when none is
    # scheduled and only an operator ``retry`` will move it.
    next_attempt_at: str | None = None
    held: bool = False
    # How it ended: posted, captured, suppressed, silent or resolved (an operator confirmed a
    # post), prefixed "fallback " when the fixed origin-unavailable answer was used.
    outcome: str | None = None
    # A delivery attempt is in flight: every operator verb waits until it ends (409).
    in_flight: bool = False


class StateChangeBody(msgspec.Struct, frozen=True, kw_only=True):
    state: str
    at: str
    error: str | None


class TaskBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The MCP task behind a task-backed continuation (docs/tasks-bridge.md). ``follow``: who
    polls it (``service`` or ``host``); ``status``: the last status applied; ``cancel``:
    ``owed`` (tasks/cancel to be sent), ``sent`` or ``failed`` (with ``cancelDetail``), else null."""

    server: str
    task_id: str
    follow: str
    status: str
    reported_at: str | None = None
    cancel: str | None = None
    cancel_detail: str | None = None


class DetailBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``GET /v1/operator/continuations/{id}``: the status plus what an operator needs to
    tell how the record got here. Never a token, payload or answer text."""

    status: StatusBody
    server_name: str
    route: str | None
    task_key: str
    history: list[StateChangeBody]
    history_complete: bool
    run_id: str | None = None  # the originating run of an interactive claim
    task: TaskBody | None = None  # set for a task-backed continuation (MCP Tasks bridge)


class LivezBody(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/livez``: always ``{"status": "up"}`` while the HTTP server runs."""

    status: str


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    error: ErrorDetail


class ListItem(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    continuation_id: str
    state: str
    origin_context: str
    mode: str
    kind: str
    server_name: str
    route: str | None
    attempts: AttemptsBody
    last_error: ErrorDetail | None
    created_at: str
    updated_at: str
    compacted: bool
    origin_context_at_compaction: str | None = None
    post_unproven: bool = False
    next_attempt_at: str | None = None
    held: bool = False
    outcome: str | None = None
    # When an operator acknowledged this dead letter, expiry or delivery missing from
    # history (``acknowledge``); None when nobody did or nothing needed it.
    acknowledged_at: str | None = None
    in_flight: bool = False


class ListResponse(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    items: list[ListItem]
    next_cursor: str | None


class HealthCauseBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One reason health is not healthy: which records, and the command that clears it."""

    code: str
    status: str
    count: int
    message: str
    ids: list[str]  # at most 100, sorted; ``count`` is exact
    commands: list[str]  # one exact operator command per listed id: the one that keeps options open
    # Where the operator chooses after looking: ``show`` per listed id, to run first.
    inspect: list[str] = []
    # Per listed id, the command that gives the record up instead ("" when there is none), and
    # what it gives up (a dead letter: retry first; acknowledge lets retention compact it).
    alternatives: list[str] = []
    alternative_note: str | None = None


class HealthBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    status: str
    counts: dict[str, int]
    history_unrecorded: int
    active: int
    causes: list[HealthCauseBody] = []


class ResolveRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    kind: str
    delivery_id: str | None = None


class RetryRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    allow_unknown: bool = False


class UiLoginBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``POST /v1/operator/ui/login``: a one-time link to the status page (valid once, briefly)."""

    login_url: str
    expires_at: str

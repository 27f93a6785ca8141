"""Wire bodies of the host API (``/v1/host/...``): a host in any language binds its runs over
loopback HTTP with these, instead of holding the in-process app handle.

Inputs forbid unknown fields (a body that tries to add a channel or a callback is refused);
camelCase JSON like the rest of the protocol.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ..continuations.rules import MAX_ROUTE_ID, MAX_RUN_ID, ROUTE_ID_PATTERN, RUN_ID_PATTERN
from .wire import StatusBody

RunState = Literal["open", "closed", "finalized", "activated", "abandoned"]
AbandonReason = Literal["host", "lease_lapsed"]

# Shown in the OpenAPI document and applied when the body is decoded;
# ``continuations.rules.check_host_run`` is the full rule (JSON Schema's "$" is the end of the
# string, Python's also matches before a final newline).
RunId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_RUN_ID,
        pattern=f"^{RUN_ID_PATTERN}+$",
        description=f"1-{MAX_RUN_ID} characters without '/' or control characters; not '.' or '..'",
    ),
]
RouteId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_ROUTE_ID,
        pattern=f"^{ROUTE_ID_PATTERN}+$",
        description=f"1-{MAX_ROUTE_ID} characters without control characters (C0, DEL, C1)",
    ),
]


class BeginRunRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """``POST /v1/host/runs``. ``replyTo`` is the physical route the channel driver gave the
    host (never a value a model produced); ``conversationId`` may carry a history bucket."""

    run_id: RunId
    conversation_id: RouteId
    reply_to: RouteId | None = None
    mode: Literal["reply", "notify_if_actionable", "capture", "silent"] = "reply"


class HistoryMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    role: Literal["user", "assistant"]
    content: str


class FinalizeRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/host/runs/{runId}/finalize``: the retained messages of the exact
    conversation bucket, oldest first, ending with the origin user/assistant pair."""

    history: list[HistoryMessage]


class ServerBinding(msgspec.Struct, frozen=True, kw_only=True):
    """The reserved values one selected server must receive, written over any configured
    value of the same name: ``env`` for a stdio server, ``headers`` for loopback HTTP. Both
    are empty once the run is closed."""

    server: str
    env: dict[str, str]
    headers: dict[str, str]


class RunBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One run as the host API reports it: its binding, settlement, lease and claims."""

    run_id: str
    conversation_id: str
    reply_to: str | None
    mode: str
    state: RunState
    abandon_reason: AbandonReason | None
    servers: list[ServerBinding]
    lease_ms: int
    lease_expires_at: str
    snapshot_digest: str | None
    claims: list[StatusBody]


class CapturedTextBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``text`` is null unless the continuation is a delivered capture."""

    continuation_id: str
    text: str | None

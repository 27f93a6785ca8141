"""MCP Tasks bridge wire types (issue 32 contract; A1 owns this module)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
OutcomeStatus = Literal[
    "working", "input_required", "completed", "failed", "cancelled", "lost", "protocol_error", "too_large"
]


class TaskHandle(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    task_id: str
    status: TaskStatus
    poll_interval_ms: int | None = None
    ttl_ms: int | None = None


class TaskOutcome(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    status: OutcomeStatus
    result: dict[str, Any] | None = None
    message: str | None = None
    poll_interval_ms: int | None = None


class TaskReport(msgspec.Struct, frozen=True, kw_only=True):
    state: str
    cancel: bool = False

"""Wire shapes of the MCP Tasks bridge (provisional copy of the shared contract; A1 owns it)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
OutcomeStatus = Literal["working", "input_required", "completed", "failed", "cancelled", "lost"]


class TaskHandle(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    task_id: str
    status: TaskStatus
    poll_interval_ms: int | None = None
    ttl_ms: int | None = None


class TaskOutcome(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    status: OutcomeStatus
    result: dict[str, Any] | None = None
    message: str | None = None
    poll_interval_ms: int | None = None


class AdoptedTask(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    continuation_id: str
    follow: Literal["service", "host"]


class TaskReport(msgspec.Struct, frozen=True, kw_only=True):
    state: str
    cancel: bool

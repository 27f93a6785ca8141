"""Health from state counts (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

Health = Literal["healthy", "degraded", "unhealthy"]
ACTIVE = frozenset({"claimed", "result_received", "synthesizing", "ready_to_deliver", "delivery_retry"})


def health_of(counts: Mapping[str, int], history_unrecorded: int) -> Health:
    """unhealthy: dead letters or unknown deliveries; degraded: pending work, expiries, or a
    delivered answer missing from history; healthy otherwise."""
    if counts.get("dead_lettered", 0) or counts.get("delivery_unknown", 0):
        return "unhealthy"
    if any(counts.get(s, 0) for s in ACTIVE) or counts.get("expired", 0) or history_unrecorded:
        return "degraded"
    return "healthy"

"""Run leases: a host that stops calling loses its unsettled runs.

In process, a service sees its host die (they are one process). Over HTTP it cannot, so a
run bound through the host API holds a lease of ``continuations.limits.runLeaseMs``: every
call the host makes on the run renews it (``heartbeat`` exists for a turn that is busy
elsewhere), and a run whose lease lapses before activation is abandoned, so its
continuations take the fixed origin-unavailable answer instead of waiting forever.

The decision is a pure function of the lease and a time passed in; :func:`lease_loop` only
asks the registry to apply it now and then.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, Protocol

import anyio

LeaseState = Literal["live", "lapsed", "settled"]
MAX_CHECK_INTERVAL_S = 1.0


def lease_state(expires_at_ms: int, settled: bool, now_ms: int) -> LeaseState:
    """``settled`` runs need no lease; otherwise the lease holds strictly before its expiry."""
    if settled:
        return "settled"
    return "live" if now_ms < expires_at_ms else "lapsed"


def lapsed(leases: Iterable[tuple[str, int, bool]], now_ms: int) -> list[str]:
    """The run ids among ``(run_id, expires_at_ms, settled)`` whose lease has lapsed."""
    return [
        run_id for run_id, expires, settled in leases if lease_state(expires, settled, now_ms) == "lapsed"
    ]


def check_interval_s(lease_ms: int) -> float:
    """How often the loop looks: a quarter lease, at most a second, so a lapse is acted on
    within a small fraction of the lease."""
    return min(MAX_CHECK_INTERVAL_S, lease_ms / 4000)


class LeaseHolder(Protocol):
    lease_ms: int

    async def expire_lapsed(self) -> list[str]: ...


async def lease_loop(holder: LeaseHolder) -> None:
    """Apply lapses until cancelled (started beside the HTTP server by ``open_service``)."""
    interval = check_interval_s(holder.lease_ms)
    while True:
        await holder.expire_lapsed()
        await anyio.sleep(interval)

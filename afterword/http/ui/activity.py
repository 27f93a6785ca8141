"""The last hour of activity, per minute, for the status page's chart.

The service keeps no time series of its own, so this ring watches state changes (the
service's ``on_change`` hook) while the process runs and forgets everything older than an
hour. It starts empty at every start: the page says since when it counts.

Counted per minute: claims (a new record), deliveries (a record entering ``delivered``),
failures (entering ``delivery_retry``, ``delivery_unknown`` or ``dead_lettered``), and the
latency from a result's arrival to its delivery, in milliseconds. A record leaves a final
state only through an operator's verb (``retry``, ``resolve``), so such a change is the
operator's act, never a new failure: an operator retry of a dead letter enters
``delivery_retry`` but is not counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...continuations.model import TERMINAL, Continuation

MINUTES = 60
MINUTE_MS = 60_000
MAX_LATENCIES_PER_MINUTE = 1000  # a sample beyond it is dropped (the counts stay exact)
FAILURES = frozenset({"delivery_retry", "delivery_unknown", "dead_lettered"})


@dataclass
class Minute:
    start_ms: int
    claims: int = 0
    deliveries: int = 0
    failures: int = 0
    latencies_ms: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Summary:
    minutes: tuple[Minute, ...]  # exactly MINUTES, oldest first; empty minutes included
    since_ms: int  # when counting began (the process start, or an hour ago)
    p50_ms: int | None
    p99_ms: int | None
    samples: int


def percentile(sorted_values: Sequence[int], q: float) -> int | None:
    """Nearest-rank percentile of already sorted values (None for no values)."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * q // 1))  # ceil(n * q), at least 1
    return sorted_values[int(min(rank, len(sorted_values))) - 1]


class ActivityRing:
    def __init__(self, clock_ms: Callable[[], int]) -> None:
        self._clock = clock_ms
        self.started_ms = clock_ms()
        self._minutes: deque[Minute] = deque()

    def __repr__(self) -> str:
        return f"<ActivityRing minutes={len(self._minutes)}>"

    def _minute(self, now: int) -> Minute:
        start = now - now % MINUTE_MS
        if not self._minutes or self._minutes[-1].start_ms < start:
            self._minutes.append(Minute(start))
        horizon = start - (MINUTES - 1) * MINUTE_MS
        while self._minutes and self._minutes[0].start_ms < horizon:
            self._minutes.popleft()
        return self._minutes[-1]

    def observe(self, old: Continuation | None, new: Continuation) -> None:
        """The service's change hook: classify one committed change."""
        if old is not None and old.state == new.state:
            return
        now = self._clock()
        minute = self._minute(now)
        if old is None:
            minute.claims += 1
        if new.state == "delivered":
            minute.deliveries += 1
            if new.result is not None and len(minute.latencies_ms) < MAX_LATENCIES_PER_MINUTE:
                done = new.receipt.delivered_at_ms if new.receipt is not None else now
                minute.latencies_ms.append(max(0, done - new.result.received_at_ms))
        elif new.state in FAILURES and (old is None or old.state not in TERMINAL):
            minute.failures += 1

    def summary(self) -> Summary:
        now = self._clock()
        self._minute(now)  # drops what is older than the hour
        by_start = {m.start_ms: m for m in self._minutes}
        first = now - now % MINUTE_MS - (MINUTES - 1) * MINUTE_MS
        minutes = tuple(
            by_start.get(s, Minute(s)) for s in range(first, first + MINUTES * MINUTE_MS, MINUTE_MS)
        )
        latencies = sorted(v for m in minutes for v in m.latencies_ms)
        return Summary(
            minutes=minutes,
            since_ms=max(self.started_ms, first),
            p50_ms=percentile(latencies, 0.50),
            p99_ms=percentile(latencies, 0.99),
            samples=len(latencies),
        )

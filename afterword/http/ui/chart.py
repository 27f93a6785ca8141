"""The last hour as bars: geometry for the SVG the page template draws (no script needed)."""

from __future__ import annotations

from dataclasses import dataclass

from ...continuations.rules import format_ms
from .activity import MINUTES, Summary, percentile

BAR_W = 8
GAP = 2
HEIGHT = 40
WIDTH = MINUTES * (BAR_W + GAP)


@dataclass(frozen=True)
class Bar:
    x: int
    y: int
    height: int
    title: str


@dataclass(frozen=True)
class Row:
    name: str
    css: str
    total: int
    peak: int
    bars: tuple[Bar, ...]


def _row(name: str, css: str, values: list[int], unit: str, starts: list[int]) -> Row:
    peak = max(values) if values else 0
    bars = []
    for i, (value, start) in enumerate(zip(values, starts, strict=True)):
        if value <= 0:
            continue
        h = max(1, round(HEIGHT * value / peak))
        minute = format_ms(start)[11:16]
        bars.append(Bar(x=i * (BAR_W + GAP), y=HEIGHT - h, height=h, title=f"{minute} UTC: {value}{unit}"))
    return Row(name=name, css=css, total=sum(values), peak=peak, bars=tuple(bars))


def chart_rows(summary: Summary) -> tuple[Row, ...]:
    starts = [m.start_ms for m in summary.minutes]
    p99 = [percentile(sorted(m.latencies_ms), 0.99) or 0 for m in summary.minutes]
    return (
        _row("claims", "claims", [m.claims for m in summary.minutes], "", starts),
        _row("deliveries", "deliveries", [m.deliveries for m in summary.minutes], "", starts),
        _row("failures", "failures", [m.failures for m in summary.minutes], "", starts),
        _row("p99 result-to-delivery latency", "latency", p99, " ms", starts),
    )

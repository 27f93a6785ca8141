"""The run report: states explored per workload and model, violations with their seeds, time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import msgspec

from .checkers import Violation
from .runner import FaultResult, ModelResult

_json = msgspec.json.Encoder()


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]


_MODEL_HEADER = (
    "workload", "model", "seed", "ops", "disk-ops", "space", "mode",
    "states", "trees", "in-recovery", "violations", "seconds",
)  # fmt: skip
_FAULT_HEADER = ("workload", "seed", "ops", "calls", "plans", "mode", "fired", "violations", "seconds")


def _model_rows(models: Sequence[ModelResult]) -> list[tuple[object, ...]]:
    return [
        (
            r.workload,
            r.model,
            r.seed,
            r.ops,
            r.disk_ops,
            f"{r.space}" if r.exhaustive else f">{r.space - 1}",
            "exhaustive" if r.exhaustive else "sampled",
            r.states,
            r.trees,
            r.recovery_states,
            len(r.violations),
            f"{r.seconds:.1f}",
        )
        for r in models
    ]


def _fault_rows(faults: Sequence[FaultResult]) -> list[tuple[object, ...]]:
    return [
        (
            r.workload,
            r.seed,
            r.ops,
            " ".join(f"{k}={v}" for k, v in r.calls.items()),
            r.plans,
            "exhaustive" if r.exhaustive else "sampled",
            r.injected,
            len(r.violations),
            f"{r.seconds:.1f}",
        )
        for r in faults
    ]


def render(
    models: Sequence[ModelResult], faults: Sequence[FaultResult], *, seconds: float, max_examples: int = 3
) -> str:
    """The whole report as text: one table per kind of exploration, totals, violations."""
    lines: list[str] = []
    if models:
        lines += ["crash states", *_table(_MODEL_HEADER, _model_rows(models)), ""]
    if faults:
        lines += ["I/O-error injection", *_table(_FAULT_HEADER, _fault_rows(faults)), ""]
    violations = [v for r in models for v in r.violations] + [v for r in faults for v in r.violations]
    lines.append(
        f"{sum(r.states for r in models)} crash states ({sum(r.trees for r in models)} distinct trees, "
        f"{sum(r.recovery_states for r in models)} crashes during recovery), "
        f"{sum(r.injected for r in faults)} injected faults, {len(violations)} violations, {seconds:.1f} s"
    )
    if violations:
        lines.append("")
        lines += render_violations(violations, max_examples=max_examples)
    return "\n".join(lines)


def render_violations(violations: Sequence[Violation], *, max_examples: int = 3) -> list[str]:
    """Violations grouped by workload, model and checker; a few examples each, with the
    command that reproduces them."""
    groups: dict[tuple[str, str, str], list[Violation]] = {}
    for v in violations:
        groups.setdefault((v.workload, v.model, v.checker), []).append(v)
    lines: list[str] = []
    for (workload, model, checker), items in groups.items():
        lines.append(f"{workload} / {model}: {checker} x{len(items)}")
        for v in items[:max_examples]:
            lines.append(f"  seed {v.seed} state {v.state}: {v.detail}")
            if v.where:
                lines.append(f"    at: {v.where}")
            lines.append(f"    reproduce: {v.reproduce()}")
    return lines


def to_json(models: Sequence[ModelResult], faults: Sequence[FaultResult], *, seconds: float) -> bytes:
    body = {
        "crash": [asdict(r) for r in models],
        "faults": [asdict(r) for r in faults],
        "seconds": seconds,
    }
    return _json.encode(body)

"""python -m tools.killtest [--soak] [--kills N] [--continuations N] [--threads N] [--seed S] [--json PATH]
python -m tools.killtest --workload tasks [--kills N] [--continuations N] [--seed S] [--json PATH]

Exit status 0 when the verdict is ok, 1 when it is not.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .run import PLANTS, run_killtest
from .verdict import report_json

# The published soak (docs/crash-testing.md): 1,000 kills, the load ending with the last one
# (the continuation count is only a cap). Preloading spares it a thousand cold interpreter
# starts (see spawn.py) and the shorter interval keeps it near half an hour on two shared
# cores; a retention limit of 5,000 makes retention evict within the run.
SOAK: dict[str, Any] = {
    "kills": 1000,
    "continuations": 1_000_000,
    "threads": 4,
    "preload": True,
    "terminal_max_records": 5_000,
    "interval": (0.1, 0.6),
}
QUICK: dict[str, Any] = {"kills": 5, "continuations": 300, "threads": 4}


def _positive(text: str) -> int:
    # --kills -1 ran nothing and still printed "ok": a count below one verifies nothing
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.killtest", description=__doc__)
    parser.add_argument(
        "--soak", action="store_true", help=f"the 1,000-kill soak ({SOAK}); flags below override"
    )
    parser.add_argument("--kills", type=_positive)
    parser.add_argument("--continuations", type=_positive, help="cap on the claims the load makes")
    parser.add_argument("--threads", type=_positive, help="producer threads")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--terminal-max-records", type=_positive, help="the service's retention limit")
    parser.add_argument(
        "--observe-rate", type=float, default=50.0, help="status polls per second during the run"
    )
    parser.add_argument("--plant", choices=PLANTS, help="corrupt the state after the first kill (must fail)")
    parser.add_argument(
        "--interval", help="LO,HI: seconds the service runs between a restart and a kill (0.2,1.2)"
    )
    parser.add_argument(
        "--preload", action="store_true", help="fork each service from a server with afterword imported"
    )
    parser.add_argument("--cold", action="store_true", help="start each service as a new interpreter")
    parser.add_argument("--json", help="also write the report to this file")
    parser.add_argument(
        "--workload",
        choices=("claims", "tasks"),
        default="claims",
        help="claims: detached claims and results (default); tasks: MCP Tasks adopted and followed "
        "by the service (--continuations caps the tasks; --threads, --plant and retention do not apply)",
    )
    args = parser.parse_args(argv)
    if args.workload == "tasks":
        return _tasks(parser, args)
    base = dict(SOAK if args.soak else QUICK)
    for name in ("kills", "continuations", "threads", "terminal_max_records"):
        if getattr(args, name) is not None:
            base[name] = getattr(args, name)
    if args.preload or args.cold:
        base["preload"] = args.preload and not args.cold
    if args.interval is not None:
        lo, _, hi = args.interval.partition(",")
        try:
            base["interval"] = (float(lo), float(hi or lo))
        except ValueError:
            parser.error(f"--interval wants LO,HI in seconds, not {args.interval!r}")
    report = run_killtest(
        **base,
        seed=args.seed,
        observe_rate=args.observe_rate,
        plant=args.plant,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    text = report_json(report)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0 if report.ok else 1


def _interval(parser: argparse.ArgumentParser, text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    try:
        return (float(lo), float(hi or lo))
    except ValueError:
        parser.error(f"--interval wants LO,HI in seconds, not {text!r}")


def _tasks(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .tasks import run_tasks_killtest

    if args.soak or args.plant or args.threads or args.terminal_max_records:
        parser.error("--workload tasks takes --kills, --continuations, --seed, --interval, --cold, --json")
    options: dict[str, Any] = {"kills": args.kills or 5, "preload": not args.cold}
    if args.continuations is not None:
        options["tasks"] = args.continuations
    if args.interval is not None:
        options["interval"] = _interval(parser, args.interval)
    report = run_tasks_killtest(
        **options, seed=args.seed, progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    text = report_json(report)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

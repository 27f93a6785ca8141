"""python -m tools.killtest [--kills N] [--continuations N] [--threads N] [--seed S] [--json PATH]"""

from __future__ import annotations

import argparse
import sys

from .run import report_json, run_killtest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.killtest", description=__doc__)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--continuations", type=int, default=300)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    report = run_killtest(kills=args.kills, continuations=args.continuations, threads=args.threads, seed=args.seed)
    text = report_json(report)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``python -m tools.crashsim run|state|fault|list``.

Examples::

    python -m tools.crashsim run                          # every workload and model, sampled
    python -m tools.crashsim run --exhaustive --ops 4     # every state of short workloads
    python -m tools.crashsim state --workload checkpoint --model torn --seed 3 --state '57/12=4'
    python -m tools.crashsim fault --workload blobs --seed 0 --plan 'fsync#7:EIO:once'
    python -m tools.crashsim damage --budget 40            # damaged state: fail closed or exact
    python -m tools.crashsim damage --workload checkpoint --case '3:delete:secret'

Exit status: 0 no violation, 1 violations found, 2 usage error.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor

from .damage import DAMAGE_WORKLOADS, DamageResult, render_damage, run_damage
from .faults import KINDS, FaultPlan
from .model import DEFAULT_MODELS, MODELS, get_model
from .report import render, render_violations, to_json
from .runner import FaultResult, ModelResult, Scratch, Settings, Unit, replay_state, run_fault, run_unit
from .workloads import WORKLOADS, get_workload

HASH_SEED = "0"


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.crashsim", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="explore crash states and inject I/O errors")
    run.add_argument("--workload", action="append", help="name or module:Class (repeatable; default all)")
    run.add_argument(
        "--model",
        action="append",
        choices=sorted(MODELS),
        help=f"repeatable; default {', '.join(DEFAULT_MODELS)}",
    )
    run.add_argument("--seeds", default="0", help="e.g. 0 or 0-9 or 1,5,7 (default 0)")
    run.add_argument("--ops", type=int, help="logical operations per workload (default: its own)")
    size = run.add_mutually_exclusive_group()
    size.add_argument("--budget", type=int, default=400, help="crash states per workload and model")
    size.add_argument("--exhaustive", action="store_true", help="every crash state, however many")
    run.add_argument("--recovery-budget", type=int, default=16, help="crash states per recovery run")
    run.add_argument("--no-probe", action="store_true", help="skip writing on after recovery")
    faults = run.add_mutually_exclusive_group()
    faults.add_argument("--fault-budget", type=int, default=24, help="fault plans per workload")
    faults.add_argument("--all-faults", action="store_true", help="every fault plan")
    faults.add_argument("--no-faults", action="store_true")
    run.add_argument("--no-crash", action="store_true", help="only inject I/O errors")
    run.add_argument("--fault-kind", action="append", choices=KINDS, help="repeatable; default all")
    run.add_argument("--json", help="also write the results as JSON to this file")
    run.add_argument("--workdir", help="where scratch directories go (default /dev/shm or TMPDIR)")
    run.add_argument("--jobs", type=int, default=1, help="worker processes (units run in parallel)")

    state = sub.add_parser("state", help="check one crash state again (from a report)")
    state.add_argument("--workload", required=True)
    state.add_argument("--model", required=True, choices=sorted(MODELS))
    state.add_argument("--seed", type=int, required=True)
    state.add_argument("--ops", type=int)
    state.add_argument("--state", required=True, help="the state id a report printed")
    state.add_argument("--keep", help="also materialize the crash state into this new directory")
    state.add_argument("--fingerprint", help="the log fingerprint the report printed (checked)")
    state.add_argument("--workdir")

    fault = sub.add_parser("fault", help="run one fault plan again (from a report)")
    fault.add_argument("--workload", required=True)
    fault.add_argument("--seed", type=int, required=True)
    fault.add_argument("--ops", type=int)
    fault.add_argument("--plan", required=True, help="e.g. fsync#3:EIO:once")
    fault.add_argument("--workdir")

    damage = sub.add_parser("damage", help="damage state after each acknowledged operation")
    damage.add_argument(
        "--workload", action="append", help=f"repeatable; default {', '.join(DAMAGE_WORKLOADS)}"
    )
    damage.add_argument("--seeds", default="0", help="e.g. 0 or 0-9 or 1,5,7 (default 0)")
    damage.add_argument("--ops", type=int, help="logical operations per workload (default: its own)")
    damage.add_argument("--budget", type=int, help="cases per workload and damage kind (default: all)")
    damage.add_argument("--case", help="run one case again (the id a report printed)")
    damage.add_argument("--kind", action="append", help="repeatable; only cases of this damage kind")
    damage.add_argument("--workdir")

    sub.add_parser("list", help="workloads and persistence models")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "list":
        for name, cls in WORKLOADS.items():
            print(f"workload {name:<11} ops={cls.default_ops:<3} {cls.summary}")
        for model in MODELS.values():
            print(f"model    {model.name:<11} {model.summary}")
        return 0
    try:
        if args.command == "state":
            return _state(args)
        if args.command == "fault":
            return _fault(args)
        if args.command == "damage":
            return _damage(args)
        return _run(args)
    except ValueError as exc:
        print(f"crashsim: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    names = args.workload or list(WORKLOADS)
    for name in names:
        get_workload(name)  # fail early on a bad name
    models = [get_model(m) for m in (args.model or DEFAULT_MODELS)]
    settings = Settings(
        budget=None if args.exhaustive else args.budget,
        recovery_budget=args.recovery_budget,
        probe=not args.no_probe,
        fault_budget=None if args.all_faults else args.fault_budget,
        fault_kinds=tuple(args.fault_kind or KINDS),
    )
    units: list[Unit] = []
    for seed in _seeds(args.seeds):
        for name in names:
            if not args.no_crash:
                units += [Unit(name, seed, args.ops, m.name) for m in models]
            if not args.no_faults:
                units.append(Unit(name, seed, args.ops, None))
    crash: list[ModelResult] = []
    faults: list[FaultResult] = []
    for result in _execute(units, settings, args.workdir, args.jobs):
        if isinstance(result, ModelResult):
            crash.append(result)
            _progress(
                f"{result.workload}/{result.model} seed {result.seed}: {result.states} states, "
                f"{len(result.violations)} violations, {result.seconds:.1f} s"
            )
        else:
            faults.append(result)
            _progress(
                f"{result.workload}/faults seed {result.seed}: {result.plans} plans, "
                f"{len(result.violations)} violations, {result.seconds:.1f} s"
            )
    seconds = time.perf_counter() - began
    print(render(crash, faults, seconds=seconds))
    if args.json:
        with open(args.json, "wb") as fh:
            fh.write(to_json(crash, faults, seconds=seconds))
    return 1 if any(r.violations for r in crash) or any(r.violations for r in faults) else 0


def _execute(
    units: Sequence[Unit], settings: Settings, workdir: str | None, jobs: int
) -> Iterator[ModelResult | FaultResult]:
    """Results in unit order; with ``jobs > 1`` units run in worker processes (spawned, so
    each starts clean and inherits the pinned hash seed from the environment)."""
    if jobs <= 1:
        for unit in units:
            yield run_unit(unit, settings, workdir)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(run_unit, unit, settings, workdir) for unit in units]
        for future in futures:
            yield future.result()


def _state(args: argparse.Namespace) -> int:
    workload = get_workload(args.workload)(seed=args.seed, ops=args.ops)
    with Scratch(args.workdir) as scratch:
        result, where = replay_state(
            workload, get_model(args.model), args.state, Settings(), scratch, args.keep
        )
    print(f"{workload.name} seed {args.seed} model {args.model} state {args.state}")
    print(f"  log fingerprint {result.fingerprint}; {where}")
    if args.fingerprint and args.fingerprint != result.fingerprint:
        print(
            f"  warning: the report's log had fingerprint {args.fingerprint}; the code or the workload "
            "changed since, so this id may name a different state",
            file=sys.stderr,
        )
    if args.keep:
        print(f"  crash state materialized in {args.keep}")
    if not result.violations:
        print("  no violation")
        return 0
    print("\n".join(render_violations(result.violations, max_examples=100)))
    return 1


def _fault(args: argparse.Namespace) -> int:
    workload = get_workload(args.workload)(seed=args.seed, ops=args.ops)
    plan = FaultPlan.parse(args.plan)
    with Scratch(args.workdir) as scratch:
        fired, violations = run_fault(workload, plan, Settings(), scratch)
    print(f"{workload.name} seed {args.seed} plan {plan.ident}: fault {'fired' if fired else 'never fired'}")
    if not violations:
        print("  no violation")
        return 0
    print("\n".join(render_violations(violations, max_examples=100)))
    return 1


def _damage(args: argparse.Namespace) -> int:
    import logging

    logging.disable(logging.WARNING)  # every refused or repaired case would log its reason
    results: list[DamageResult] = []
    try:
        with Scratch(args.workdir) as scratch:
            for seed in _seeds(args.seeds):
                for name in args.workload or DAMAGE_WORKLOADS:
                    workload = get_workload(name)(seed=seed, ops=args.ops)
                    result = run_damage(
                        workload, scratch, budget=args.budget, only=args.case, kinds=args.kind
                    )
                    _progress(
                        f"{name}/damage seed {seed}: {result.cases} cases, {result.violations} violations"
                    )
                    results.append(result)
    finally:
        logging.disable(logging.NOTSET)  # main() is also called in-process (tests): leave logging as found
    if args.case and not any(r.cases for r in results):  # a mistyped id must not read as a pass
        raise ValueError(
            f"no damage case {args.case!r} in this workload and seed (use an id a report printed)"
        )
    print(render_damage(results, max_examples=100 if args.case else 5))
    return 1 if any(r.violations for r in results) else 0


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _pin_hash_seed() -> None:
    """Re-run under a fixed PYTHONHASHSEED: the store iterates sets of keys (checkpoint order),
    so with per-process string hashing two runs of one seed would log different orders, and a
    state id printed by one run would not name the same state in the next."""
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
        os.execve(sys.executable, [sys.executable, "-m", "tools.crashsim", *sys.argv[1:]], env)


if __name__ == "__main__":
    _pin_hash_seed()
    sys.exit(main())

"""The job queue's crash workload, plugged into the simulator from outside afterword.

CI runs the exact command the guide shows, with a bounded budget (about 10 s; marked slow, so
it runs in CI's second step, ``python -m pytest -q -m slow``), and requires 0 violations.
``AFTERWORD_JOBQUEUE_CRASH=full`` runs every crash state of seeds 0-9 under every default
model and every fault plan instead (about 5 minutes on 2 cores).

A queue that forgets expired leases must be caught, so the workload is known to be able to fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/ and tools/ are top-level folders, not installed
    sys.path.insert(0, str(ROOT))

from afterword.disk import Disk  # noqa: E402
from examples.jobqueue import crash  # noqa: E402
from examples.jobqueue.queue import Job, JobQueue  # noqa: E402
from tools.crashsim import PROCESS, Scratch, Settings, explore  # noqa: E402

WORKLOAD = "examples.jobqueue.crash:JobQueueWorkload"
BOUNDED = ["--budget", "80", "--fault-budget", "24"]
GUIDE_COMMAND = (
    f"python -m tools.crashsim run --workload {WORKLOAD} {' '.join(BOUNDED)}"  # docs/durability-layer.md
)
FULL = ["--exhaustive", "--all-faults", "--seeds", "0-9", "--jobs", "2"]


@pytest.fixture
def scratch() -> Iterator[Scratch]:
    with Scratch() as s:
        yield s


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_the_crash_workload_runs_from_outside_the_package_with_no_violation(tmp_path: Path) -> None:
    full = os.environ.get("AFTERWORD_JOBQUEUE_CRASH") == "full"
    out = tmp_path / "crash.json"
    cmd = [
        sys.executable,
        "-m",
        "tools.crashsim",
        "run",
        "--workload",
        WORKLOAD,
        *(FULL if full else BOUNDED),
    ]
    proc = subprocess.run([*cmd, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.loads(out.read_text())
    models = {r["model"] for r in report["crash"]}
    assert models == {"process", "reorder", "torn"}
    for r in report["crash"] + report["faults"]:
        assert r["workload"] == "jobqueue" and r["violations"] == [], r
    assert all(r["states"] >= (80 if not r["exhaustive"] else 1) for r in report["crash"])
    assert all(r["injected"] > 0 for r in report["faults"])
    if full:  # the figures docs/crash-testing.md quotes
        print(proc.stdout)


def test_the_script_reaches_every_promise_within_its_first_operations() -> None:
    """The skeleton exercises a repeat enqueue, a stale ack, an expired lease offered again,
    a dead-letter by nack and one by lease, and an ack after a nack, for any seed."""
    for seed in range(5):
        workload = crash.JobQueueWorkload(seed=seed)
        jobs: dict[str, crash.MJob] = {}
        seen: set[str] = set()
        for n, op in enumerate(workload.script, 1):
            before = dict(jobs)
            crash.apply(jobs, n, op)
            for i, job in jobs.items():
                old = before.get(i)
                if old and old.state == "leased" and job.state == "leased" and job.leased_by != old.leased_by:
                    seen.add("offered again")
                if old and old.state != "dead" and job.state == "dead":
                    seen.add(f"dead by {op.kind}")
                if old and old.error and job.state == "done":
                    seen.add("done after a nack")
            if op.kind == "enqueue" and crash.jid(op.key) in before:
                seen.add("repeat")
            if op.kind == "ack" and before == jobs:
                seen.add("stale ack")
        assert seen == {
            "offered again",
            "dead by nack",
            "dead by lease",
            "repeat",
            "stale ack",
            "done after a nack",
        }, seed


class ForgetfulQueue(JobQueue):
    """Broken on purpose: its index drops leased jobs, so an expired lease is never offered again."""

    def _index(self, jid: str, old: Job | None, new: Job | None) -> None:
        if new is None or new.state != "leased":
            super()._index(jid, old, new)


class ForgetfulWorkload(crash.JobQueueWorkload):
    @staticmethod
    def _open(state_dir: str, disk: Disk | None, clock: list[int]) -> JobQueue:
        return ForgetfulQueue.open(
            state_dir,
            disk=disk,
            options=crash.OPTIONS,
            clock=lambda: clock[0],
            max_attempts=crash.MAX_ATTEMPTS,
            backoff_ms=crash.BACKOFF_MS,
        )


def test_a_queue_that_forgets_expired_leases_is_caught(scratch: Scratch) -> None:
    result = explore(ForgetfulWorkload(seed=0), PROCESS, Settings(budget=40), scratch)
    checkers = {v.checker for v in result.violations}
    # the prefix check sees the lease of op 7 never happen; the probe sees the job never offered
    assert {"not-a-prefix", "probe"} <= checkers, checkers
    probes = [v.detail for v in result.violations if v.checker == "probe"]
    assert any(d.startswith("offered [") and "expected [" in d for d in probes), probes
    # an unregistered workload is named by module:Class, so the printed command replays it
    assert ":ForgetfulWorkload --model process" in result.violations[0].reproduce()

"""The kill test's Tasks workload: MCP Tasks adopted as continuations, finishing around SIGKILLs.

A real Tasks server (tests/tasks_servers/sdk_server.py, on the MCP SDK 2.x extension API) runs
on loopback HTTP for the whole run and is never killed; afterword follows its tasks itself
(``follow: "service"``). A host loop, one run per task, does what a host does: ``begin_run``,
``tools/call`` answered with a task handle, adoption (``POST /v1/host/runs/{runId}/tasks``),
``finalize`` and ``activate``, retrying each call through connection errors (all are
idempotent; adoption by (run, server, taskId)). Each task stays ``working`` until the test
opens its gate, and the seeded schedule picks when: while afterword is **down** (right after a
SIGKILL), while it is **starting** (spawned, not yet listening) or while it is **polling**
(half-way between a restart and the next kill). Every gate is open by the end.

Verdict, beside the generic one of ``verdict.judge`` (an acknowledged record must end
terminal or be evidenced; an outbox key posted twice is duplicated):

- every adopted task has exactly one continuation, whatever the retries (else *duplicated*);
- every delivered answer is its own task's (the task key is in its text; else *misdelivered*);
- a task-backed continuation still not terminal when the drain gives up is *stuck*; gone
  without evidence is *lost*. A dead-letter is a visible end, counted by cause.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from .run import ServiceRefused, _free_port, _Server
from .verdict import TERMINAL, KillReport, Outbox, Seen, expected_health, judge, percentiles

TESTS = Path(__file__).resolve().parents[2] / "tests"
SERVER = "tasks"
PHASES = ("down", "starting", "polling")
HISTORY = [
    {"role": "user", "content": "please run the nightly check"},
    {"role": "assistant", "content": "Started; the answer will follow here."},
]


@dataclass
class TasksReport(KillReport):
    adopted: int = 0
    misdelivered: int = 0
    runs_forgotten: int = 0  # adopted, run lost to a restart before activate: the fallback answer
    not_adopted: int = 0  # the restart came before the adoption was acknowledged
    continuations_per_task: dict[str, int] = field(default_factory=dict)  # "1": n tasks, "2": ...
    gates_opened: dict[str, int] = field(default_factory=dict)  # by phase

    @property
    def ok(self) -> bool:
        return super().ok and self.misdelivered == 0


class _RunForgotten(Exception):
    """The service answered 404 for the run: a restart forgot it before it was activated."""


class _Gates:
    """Which task waits for which phase; opens gates in the Tasks server's gate directory."""

    def __init__(self, root: Path, rng: random.Random) -> None:
        self.dir = root / "gates"
        self.dir.mkdir()
        self.rng = rng
        self.lock = threading.Lock()
        self.waiting: dict[str, list[str]] = {phase: [] for phase in PHASES}
        self.opened: Counter[str] = Counter()

    def add(self, key: str) -> None:
        with self.lock:
            self.waiting[self.rng.choice(PHASES)].append(key)

    def open(self, phase: str | None = None) -> None:
        """Open the gates waiting for ``phase`` (None: every gate, counted as ``end``)."""
        with self.lock:
            phases = PHASES if phase is None else (phase,)
            keys = [(p, k) for p in phases for k in self.waiting[p]]
            for p in phases:
                self.waiting[p] = []
        for p, key in keys:
            tmp = self.dir / f".{key}.tmp"
            tmp.write_text(json.dumps({"status": "completed", "text": f"answer for {key}"}))
            tmp.rename(self.dir / key)
            self.opened[p if phase is not None else "end"] += 1


class _Host:
    """The host loop: one run per task, in its own thread and event loop."""

    def __init__(self, base: str, token: str, tasks_url: str, total: int, gates: _Gates) -> None:
        self.base = base
        self.token = token
        self.tasks_url = tasks_url
        self.total = total
        self.gates = gates
        self.closing = threading.Event()
        self.stop = threading.Event()
        self.adopted: dict[str, set[str]] = {}  # task key -> every continuation id adoption answered
        self.forgotten: set[str] = set()  # adopted, then the run was forgotten before activate
        self.unadopted = 0  # the run was forgotten before the adoption was acknowledged
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            anyio.run(self._loop)
        except BaseException as exc:  # reported by the driver, not lost in a thread
            self.error = exc

    async def _call(self, client: httpx.AsyncClient, path: str, body: dict[str, Any] | None) -> Any:
        while not self.stop.is_set():
            try:
                r = await client.post(self.base + path, json=body)
            except httpx.HTTPError:
                await anyio.sleep(0.05)
                continue
            if r.status_code == 200:
                return r.json()
            if r.status_code == 404:  # runs live in memory: a restart forgot this one
                raise _RunForgotten(path)
            raise RuntimeError(f"POST {path}: HTTP {r.status_code} {r.text[:300]}")
        return None

    async def _loop(self) -> None:
        sys.path.insert(0, str(TESTS))
        from _tasks_client import connect

        headers = {"Authorization": f"Bearer {self.token}"}
        async with (
            httpx.AsyncClient(timeout=10, headers=headers, trust_env=False) as client,
            connect(self.tasks_url) as tasks,
        ):
            for index in range(self.total):
                if self.closing.is_set():
                    return
                await self._one(client, tasks, index)

    async def _one(self, client: httpx.AsyncClient, tasks: Any, index: int) -> None:
        try:
            await self._turn(client, tasks, index)
        except _RunForgotten:
            # A restart before activate forgot the run (runs are in memory). Before adoption
            # the task was never afterword's; after it, recovery answers the run's
            # continuations with the fixed origin-unavailable text, as for any crashed turn.
            key = f"task-{index:05d}"
            if key in self.adopted:
                self.forgotten.add(key)
            else:
                self.unadopted += 1

    async def _turn(self, client: httpx.AsyncClient, tasks: Any, index: int) -> None:
        key, run = f"task-{index:05d}", f"run-{index:05d}"
        chat = f"kill:chat-{index:05d}"
        body = {"runId": run, "conversationId": chat, "replyTo": chat, "mode": "reply"}
        if await self._call(client, "/v1/host/runs", body) is None:
            return
        handle = await tasks.start("sdk_work", {"key": key})
        # Gated whether or not the adoption is acknowledged: a kill after the service committed
        # it but before it answered leaves a continuation this loop never learns of, and its
        # task must end too (it is then answered like any crashed turn's).
        self.gates.add(key)
        adoption = {"server": SERVER, "taskId": handle.task_id, "status": handle.status}
        if handle.poll_interval_ms is not None:
            adoption["pollIntervalMs"] = handle.poll_interval_ms
        for _ in range(2):  # the second asks again: adoption must answer the same id
            adopted = await self._call(client, f"/v1/host/runs/{run}/tasks", adoption)
            if adopted is None:
                return
            self.adopted.setdefault(key, set()).add(str(adopted["continuationId"]))
        for verb, verb_body in (("finalize", {"history": HISTORY}), ("activate", None)):
            if await self._call(client, f"/v1/host/runs/{run}/{verb}", verb_body) is None:
                return


def _write_config(root: Path, port: int, tasks_url: str) -> None:
    mcp = {"mcpServers": {SERVER: {"url": tasks_url}}}
    (root / "mcp.json").write_text(json.dumps(mcp))
    config = {
        "tools": {"mcpConfigPath": "./mcp.json", "continuationServers": [SERVER]},
        "continuations": {"port": port, "stateDir": "state"},
    }
    (root / "afterword.json").write_text(json.dumps(config))


def _start_tasks_server(root: Path, gates: Path, port: int) -> subprocess.Popen[bytes]:
    log = (root / "tasks-server.log").open("ab")
    script = TESTS / "tasks_servers" / "sdk_server.py"
    args = [
        sys.executable,
        str(script),
        "--http",
        "--port",
        str(port),
        "--gates",
        str(gates),
        "--poll-ms",
        "50",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the Tasks server exited with {proc.returncode} (see {root}/tasks-server.log)"
            )
        try:  # a TCP connect: a GET on /mcp would open the server's event stream
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the Tasks server did not listen within 60 s")


def run_tasks_killtest(
    *,
    kills: int = 5,
    tasks: int = 100_000,
    seed: int | None = None,
    workdir: str | None = None,
    interval: tuple[float, float] = (0.3, 1.2),
    preload: bool = True,
    min_tasks_per_kill: int = 1,
    progress: Any = None,
) -> TasksReport:
    """Run the Tasks kill test (see the module docstring); reproducible schedule from ``seed``.

    ``tasks`` caps the load (it also ends with the last kill); ``min_tasks_per_kill`` delays
    each kill until that many more tasks were adopted (at most 30 s more), so a loaded
    machine still adopts work between kills.
    """
    from afterword.clients.operator import read_host_token, read_operator_token
    from afterword.config import load_config

    seed = seed if seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="afterword-killtest-tasks-", dir=workdir))
    root.chmod(0o700)
    if progress is not None:
        progress(f"state, outbox, gates and logs in {root}")
    port, tasks_port = _free_port(), _free_port()
    tasks_url = f"http://127.0.0.1:{tasks_port}/mcp"
    _write_config(root, port, tasks_url)
    gates = _Gates(root, random.Random(rng.random()))
    tasks_server = _start_tasks_server(root, gates.dir, tasks_port)
    server = _Server(root, port, preload=preload)
    refused: str | None = None
    done_kills = 0
    try:
        server.start()
        config = load_config(root / "afterword.json", check_secrets=False)
        host = _Host(server.base, read_host_token(config), tasks_url, tasks, gates)
        host.thread.start()
        load_began = time.monotonic()
        try:
            while done_kills < kills:
                pause = rng.uniform(*interval)
                time.sleep(pause / 2)
                gates.open("polling")
                time.sleep(pause / 2)
                _await_adoptions(host, len(host.adopted) + min_tasks_per_kill)
                server.kill()
                done_kills += 1
                gates.open("down")
                server.start(after_spawn=lambda: gates.open("starting"))
                if progress is not None and done_kills % 25 == 0:
                    progress(f"{done_kills} kills, {len(host.adopted)} tasks adopted")
        except ServiceRefused as exc:
            refused = f"after kill {done_kills}: {exc}"
        load_seconds = time.monotonic() - load_began
        host.closing.set()
        if refused is not None:
            host.stop.set()
        host.thread.join(timeout=120)
        host.stop.set()
        gates.open()
        report = TasksReport(
            seed=seed,
            kills=done_kills,
            continuations=sum(len(c) for c in host.adopted.values()),
            acknowledged_claims=len(host.adopted),
            acknowledged_results=len(host.adopted),
            refused_start=refused,
            adopted=len(host.adopted),
        )
        if host.error is not None:
            error = host.error
            while isinstance(error, BaseExceptionGroup) and error.exceptions:
                error = error.exceptions[0]  # the first leaf says what went wrong
            report.problem(f"the host loop failed: {type(error).__name__}: {error}")
            report.lost += 1  # the run did not do what it reports; never call it ok
        if refused is not None:
            report.problem("the service refused to start " + refused)
        else:
            _check(report, server, host, read_operator_token(config))
            server.stop()
    finally:
        tasks_server.terminate()
        tasks_server.wait(timeout=30)
    report.gates_opened = dict(gates.opened)
    report.kills_per_minute = round(done_kills / (load_seconds / 60), 1) if load_seconds else 0.0
    report.continuations_per_kill = round(report.adopted / done_kills, 1) if done_kills else 0.0
    report.recovery_ms = percentiles(server.recovery_ms)
    report.load_seconds = round(load_seconds, 1)
    report.seconds = round(time.monotonic() - began, 1)
    return report


def _await_adoptions(host: _Host, target: int) -> None:
    end = time.monotonic() + 30
    while len(host.adopted) < target and time.monotonic() < end and host.thread.is_alive():
        time.sleep(0.02)


def judge_tasks(
    report: TasksReport,
    adopted: Mapping[str, set[str]],
    final: Mapping[str, Seen | None],
    outbox_lines: Sequence[Mapping[str, Any]],
    pending: Iterable[str],
    forgotten: Iterable[str] = (),
) -> None:
    """The Tasks verdict (pure): ``adopted`` maps task key -> every continuation id its adoption
    answered; ``final`` the status read at the end by task key (None: 404); ``outbox_lines`` the
    outbox file's lines; ``pending`` the keys still not terminal when the drain gave up;
    ``forgotten`` the keys whose run a restart forgot before activate (answered with the fixed
    origin-unavailable text, not the task's answer)."""
    claims = {key: min(cids) for key, cids in adopted.items()}
    # Every task's gate is open by the end: its result exists, so each must end terminal.
    judge(report, claims, set(claims.values()), final, {}, Outbox.of(outbox_lines), pending)
    per_task = Counter(len(cids) for cids in adopted.values())
    report.continuations_per_task = {str(n): count for n, count in sorted(per_task.items())}
    for key, cids in adopted.items():
        if len(cids) != 1:  # one task, two continuations: two answers could follow
            report.duplicated += len(cids) - 1
            report.problem(f"{key}: adopted as {len(cids)} continuations {sorted(cids)}")
    texts: dict[str, list[str]] = {}
    for line in outbox_lines:
        cid = str(line["deliveryKey"]).rpartition(":")[0]
        texts.setdefault(cid, []).append(str(line.get("text", "")))
    skip = set(forgotten)
    report.runs_forgotten = len(skip)
    for key, cid in claims.items():
        delivered = texts.get(cid)
        if key not in skip and delivered and not any(key in text for text in delivered):
            report.misdelivered += 1
            report.problem(f"{key}: the delivered text does not carry its own task's answer")


def _check(report: TasksReport, server: _Server, host: _Host, operator: str) -> None:
    claims = {key: min(cids) for key, cids in host.adopted.items()}
    final: dict[str, Seen | None] = {}
    pending = dict(claims)
    quiet_until = time.monotonic() + 60  # give up once no record progressed for this long
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {operator}"}, trust_env=False) as client:
        while pending and time.monotonic() < quiet_until:
            for key, cid in list(pending.items()):
                r = client.get(f"{server.base}/v1/operator/continuations/{cid}")
                if r.status_code not in (200, 404):
                    report.problem(f"{key}: status answered HTTP {r.status_code}")
                    continue
                seen = Seen.of(r.json()["status"]) if r.status_code == 200 else None
                if final.get(key, 0) != seen:
                    quiet_until = time.monotonic() + 60
                final[key] = seen
                if seen is None or seen.state in TERMINAL:
                    del pending[key]
            if pending:
                time.sleep(0.2)
        unknown = _unfinished_others(client, server.base, set(claims.values()))
        health = client.get(server.base + "/v1/operator/health").json()
    path = server.root / "outbox.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []
    judge_tasks(report, host.adopted, final, lines, pending, host.forgotten)
    report.not_adopted = host.unadopted
    for cid, state in unknown:  # adopted, unacknowledged (the kill came first), still not ended
        report.stuck += 1
        report.problem(f"{cid}: an adoption the host never saw acknowledged is still {state}")
    report.health = str(health["status"])
    expected = expected_health(report.states)
    report.health_consistent = report.health == expected
    if not report.health_consistent:
        report.problem(f"health {report.health} but the states say {expected}")


def _unfinished_others(client: httpx.Client, base: str, known: set[str]) -> list[tuple[str, str]]:
    """Continuations the host loop never learned of (the kill came between the service's
    commit of an adoption and its answer) that are still not terminal."""
    found: list[tuple[str, str]] = []
    cursor: str | None = None
    while True:
        r = client.get(base + "/v1/operator/continuations", params={"cursor": cursor} if cursor else {})
        if r.status_code != 200:
            raise RuntimeError(f"listing continuations: HTTP {r.status_code} {r.text[:300]}")
        page = r.json()
        found.extend(
            (item["continuationId"], item["state"])
            for item in page["items"]
            if item["continuationId"] not in known and item["state"] not in TERMINAL
        )
        cursor = page.get("nextCursor")
        if not cursor:
            return found

"""The kill test: a real `afterword serve`, producers on loopback, SIGKILLs at seeded times.

Producers claim on a detached named route and submit one result per claim, retrying on
connection errors (both requests are idempotent). An operation counts as acknowledged once
the service answered 200. After the last restart the producers finish what they started,
the service drains, every acknowledged claim's status is read and ``verdict.judge`` decides
(lost, duplicated, stuck, evicted with evidence, phantom receipts). A service that will not
start again after a kill fails the run.

A *plant* corrupts the state directory behind the service's back after the first kill, so
the checker is seen to catch it: ``delete-record`` deletes the record file of a claim that
has no result (the service must either refuse to start or have lost it), ``refuse-start``
leaves a stray file among the record files (the store refuses to open).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from .observe import RssSampler, StatusObserver
from .spawn import start_serve
from .verdict import TERMINAL, KillReport, Outbox, Seen, expected_health, judge, percentiles

TOKEN = "killtest-detached-token-0123456789"
PLANTS = ("delete-record", "refuse-start")
PLANT_KEY = "plant-00000"


class ServiceRefused(RuntimeError):
    """`afterword serve` exited or never listened after a (re)start."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _payload_hash(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class _Server:
    def __init__(self, root: Path, port: int, *, preload: bool = False) -> None:
        self.root = root
        self.base = f"http://127.0.0.1:{port}"
        self.preload = preload
        self.proc: Any = None  # subprocess.Popen, or spawn.ForkedServe with preload
        self.killed_at: float | None = None
        self.recovery_ms: list[float] = []  # SIGKILL sent -> the restarted service answers

    def pid(self) -> int | None:
        proc = self.proc
        return int(proc.pid) if proc is not None and proc.poll() is None else None

    def start(self, after_spawn: Callable[[], None] | None = None) -> None:
        """Start and wait until it answers; ``after_spawn`` runs while it is still starting."""
        config, log = str(self.root / "afterword.json"), str(self.root / "serve.log")
        self.proc = start_serve(config, log, {"KILLTEST_TOKEN": TOKEN}, preload=self.preload)
        if after_spawn is not None:
            after_spawn()
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise ServiceRefused(
                    f"afterword serve exited with {self.proc.returncode}: {self._log_tail()}"
                )
            try:
                httpx.get(self.base + "/v1/operator/health", timeout=1, trust_env=False)
            except httpx.HTTPError:
                time.sleep(0.02)
                continue
            if self.killed_at is not None:
                self.recovery_ms.append((time.monotonic() - self.killed_at) * 1000)
                self.killed_at = None
            return
        self.proc.kill()
        raise ServiceRefused("afterword serve did not listen within 60 s")

    def _log_tail(self) -> str:
        try:
            lines = (self.root / "serve.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return lines[-1][:300] if lines else "(no output)"

    def kill(self) -> None:
        assert self.proc is not None
        self.killed_at = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def _write_config(root: Path, port: int, terminal_max_records: int | None) -> None:
    os.chmod(root, 0o700)
    section: dict[str, Any] = {
        "port": port,
        "stateDir": "state",
        "namedRoutes": {"load": {"mode": "notify_if_actionable", "conversationId": "load:room"}},
        "detachedServices": [{"name": "loadgen", "tokenEnv": "KILLTEST_TOKEN"}],
    }
    if terminal_max_records is not None:
        section["retention"] = {"terminalMaxRecords": terminal_max_records}
    (root / "afterword.json").write_text(json.dumps({"continuations": section}))


class _Producers:
    def __init__(self, base: str, total: int, threads: int, observer: StatusObserver) -> None:
        self.base = base
        self.total = total
        self.threads = threads
        self.observer = observer
        self.lock = threading.Lock()
        self.next = 0
        self.claims: dict[str, dict[str, Any]] = {}  # task key -> acknowledged claim response
        self.results: set[str] = set()  # continuation ids whose result was acknowledged
        self.closing = threading.Event()  # take no new task; finish the one in hand
        self.stop = threading.Event()  # give up retrying
        self.deadline = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    def _call(self, client: httpx.Client, method: str, url: str, **kw: Any) -> httpx.Response | None:
        """Retry connection failures (the server may be down) until stopped; both calls are idempotent."""
        while not self.stop.is_set():
            try:
                return client.request(method, url, **kw)
            except httpx.HTTPError:
                time.sleep(0.05)
        return None

    def claim(self, client: httpx.Client, key: str) -> dict[str, Any] | None:
        r = self._call(
            client,
            "POST",
            self.base + "/v1/continuations/detached/claim",
            headers={"Authorization": f"Bearer {TOKEN}", "X-Mono-Agent-Service-Name": "loadgen"},
            json={"route": "load", "taskKey": key, "taskHash": "h-" + key, "deadline": self.deadline},
        )
        if r is None or r.status_code != 200:
            return None
        claim: dict[str, Any] = r.json()
        with self.lock:
            self.claims[key] = claim
        return claim

    def _one(self, client: httpx.Client, index: int) -> None:
        key = f"job-{index:06d}"
        claim = self.claim(client, key)
        if claim is None:
            return
        payload = {"summary": f"finished {key}"}
        body = {"idempotencyKey": "r-" + key, "payloadHash": _payload_hash(payload), "payload": payload}
        token = claim["resultToken"]
        r = self._call(
            client, "PUT", claim["resultUrl"], headers={"Authorization": "Bearer " + token}, json=body
        )
        if r is not None and r.status_code == 200:
            with self.lock:
                self.results.add(claim["continuationId"])
            self.observer.watch(claim["continuationId"], claim["statusUrl"], token)

    def _worker(self) -> None:
        with httpx.Client(timeout=10, trust_env=False) as client:
            while not self.closing.is_set():
                with self.lock:
                    index = self.next
                    self.next += 1
                if index >= self.total:
                    return
                self._one(client, index)

    def run(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(self.threads)]
        for t in threads:
            t.start()
        return threads


def run_killtest(
    *,
    kills: int = 5,
    continuations: int = 300,
    threads: int = 4,
    seed: int | None = None,
    workdir: str | None = None,
    terminal_max_records: int | None = None,
    observe_rate: float = 50.0,
    plant: str | None = None,
    interval: tuple[float, float] = (0.2, 1.2),
    preload: bool = False,
    min_results_per_kill: int = 0,
    progress: Any = None,
) -> KillReport:
    """Run the kill test; the kill schedule is reproducible from ``seed``.

            ``continuations`` caps the load; the load also ends once the kills are done.
            ``terminal_max_records`` sets the service's retention limit (small values make
            retention evict during a short run). ``interval`` bounds the seconds the service runs
            between a restart and the next kill (drawn uniformly). ``preload`` forks each service from
        a fork server with afterword imported (see ``spawn``). ``min_results_per_kill`` delays each
    kill until that many more results were acknowledged (at most 30 s more), so a run on a
    loaded machine still does work between kills. ``progress`` is called with a line now and then.
    """
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"unknown plant {plant!r} (expected one of {', '.join(PLANTS)})")
    seed = seed if seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="afterword-killtest-", dir=workdir))
    port = _free_port()
    _write_config(root, port, terminal_max_records)
    if progress is not None:
        progress(f"state, outbox and serve.log in {root}")
    server = _Server(root, port, preload=preload)
    observer = StatusObserver(rate=observe_rate)
    rss = RssSampler(server.pid)
    load = _Producers(server.base, continuations, threads, observer)
    refused: str | None = None
    server.start()
    rss.start()
    observer.start()
    if plant is not None:
        with httpx.Client(timeout=10, trust_env=False) as client:
            if load.claim(client, PLANT_KEY) is None:
                raise RuntimeError("the planted claim was not acknowledged")
    load_began = time.monotonic()
    workers = load.run()
    done_kills = since = 0
    try:
        # Every requested kill happens even when the load ran out first (a fast service can
        # finish its capped load between two kills): a restart on settled state still tests
        # recovery, and a report of fewer kills than asked would verify less than it says.
        while done_kills < kills:
            time.sleep(rng.uniform(*interval))
            _await_results(load, since + min_results_per_kill)
            server.kill()
            done_kills += 1
            if plant is not None and done_kills == 1:
                _plant(plant, root, load.claims[PLANT_KEY]["continuationId"])
            server.start()
            since = len(load.results)
            if progress is not None and done_kills % 50 == 0:
                progress(f"{done_kills} kills, {len(load.claims)} claims, {time.monotonic() - began:.0f} s")
    except ServiceRefused as exc:
        refused = f"after kill {done_kills}: {exc}"
    load_seconds = time.monotonic() - load_began
    load.closing.set()
    if refused is not None:
        load.stop.set()  # nothing will answer: stop retrying at once
    for t in workers:
        t.join(timeout=120)
    load.stop.set()
    observer.stop()
    report = KillReport(
        seed=seed,
        kills=done_kills,
        continuations=len(load.claims),
        acknowledged_claims=len(load.claims),
        acknowledged_results=len(load.results),
        refused_start=refused,
    )
    if refused is not None:
        report.problem("the service refused to start " + refused)
        judge(report, {}, set(), {}, {}, _read_outbox(root), ())
    else:
        _check(report, server, load, observer)
        server.stop()
    rss.stop()
    report.kills_per_minute = round(done_kills / (load_seconds / 60), 1) if load_seconds else 0.0
    report.continuations_per_kill = round(len(load.claims) / done_kills, 1) if done_kills else 0.0
    report.recovery_ms = percentiles(server.recovery_ms)
    report.rss_mib = rss.summary()
    report.load_seconds = round(load_seconds, 1)
    report.seconds = round(time.monotonic() - began, 1)
    return report


def _await_results(load: _Producers, target: int) -> None:
    end = time.monotonic() + 30
    while len(load.results) < target and time.monotonic() < end and load.next < load.total:
        time.sleep(0.05)


def _plant(kind: str, root: Path, cid: str) -> None:
    """Corrupt the state while the service is down (see the module docstring)."""
    state = root / "state"
    if kind == "refuse-start":
        (state / "records" / "stray.rec").write_bytes(b"not a record")
        os.chmod(state / "records" / "stray.rec", 0o600)
        return
    from afterword.app.repository import LIVE
    from afterword.store import RecordStore

    # The claim may still live only in the log: checkpoint so it has a record file to lose.
    with RecordStore.open(str(state)) as store:
        store.checkpoint_sync()
    (state / "records" / ((LIVE + cid).encode().hex() + ".rec")).unlink()


def _read_outbox(root: Path) -> Outbox:
    path = root / "outbox.jsonl"
    if not path.exists():
        return Outbox()
    return Outbox.of(json.loads(line) for line in path.read_text().splitlines() if line.strip())


def _check(report: KillReport, server: _Server, load: _Producers, observer: StatusObserver) -> None:
    local = threading.local()
    clients: list[httpx.Client] = []

    def read(claim: dict[str, Any]) -> Seen | int | None:
        """The status now: Seen, None for 404, or the unexpected HTTP status."""
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=10, trust_env=False)
            clients.append(local.client)
        for _ in range(50):
            try:
                r = local.client.get(
                    claim["statusUrl"], headers={"Authorization": "Bearer " + claim["resultToken"]}
                )
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            if r.status_code == 200:
                return Seen.of(r.json())
            return None if r.status_code == 404 else int(r.status_code)
        return 599

    final: dict[str, Seen | None] = {}
    pending = dict(load.claims)
    quiet_until = time.monotonic() + 60  # give up once no record progressed for this long
    with ThreadPoolExecutor(4) as pool:
        while pending and time.monotonic() < quiet_until:
            keys = list(pending)
            progressed = False
            for key, st in zip(keys, pool.map(read, (pending[k] for k in keys)), strict=True):
                if isinstance(st, int):
                    report.problem(f"{key}: status answered HTTP {st}")
                    continue
                if final.get(key, 0) != st:
                    progressed = True
                final[key] = st
                cid = load.claims[key]["continuationId"]
                if st is None or st.state in TERMINAL or (st.state == "claimed" and cid not in load.results):
                    del pending[key]
            if progressed:
                quiet_until = time.monotonic() + 60
            if pending:
                time.sleep(0.2)
    for client in clients:
        client.close()
    claims = {key: claim["continuationId"] for key, claim in load.claims.items()}
    unread = [k for k in claims if k not in final]
    for key in unread:
        report.lost += 1  # never read: the checker cannot vouch for it
        report.problem(f"{key}: status could not be read")
    for key in unread:
        claims.pop(key)
    judge(report, claims, load.results, final, observer.seen, _read_outbox(server.root), pending)
    token = _operator_token(server.root)
    health = httpx.get(
        server.base + "/v1/operator/health",
        headers={"Authorization": "Bearer " + token},
        timeout=10,
        trust_env=False,
    ).json()
    report.health = health["status"]
    expected = expected_health(report.states)
    report.health_consistent = report.health == expected
    if not report.health_consistent:
        report.problem(f"health {report.health} but the states say {expected}")


def _operator_token(root: Path) -> str:
    from afterword.clients.operator import read_operator_token
    from afterword.config import load_config

    return read_operator_token(load_config(root / "afterword.json", check_secrets=False))

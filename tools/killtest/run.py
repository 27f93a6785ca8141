"""The kill test: a real `afterword serve`, producers on loopback, SIGKILLs at seeded times.

Producers claim on a detached named route and submit one result per claim, retrying on
connection errors (both requests are idempotent). An operation counts as acknowledged once
the service answered 200. After the last restart the load stops, the service drains, and the
checks run:

- lost: an acknowledged claim the service no longer knows, or an acknowledged result whose
  continuation still shows no result;
- duplicated: an outbox delivery key that appears more than once;
- stuck: a continuation that is neither terminal nor able to progress;
- health: the health verdict must agree with the state counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

TOKEN = "killtest-detached-token-0123456789"
TERMINAL = {"delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"}


@dataclass
class KillReport:
    seed: int
    kills: int
    continuations: int
    acknowledged_claims: int
    acknowledged_results: int
    lost: int
    duplicated: int
    stuck: int
    states: dict[str, int] = field(default_factory=dict)
    health: str = ""
    health_consistent: bool = True
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.stuck == 0 and self.health_consistent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _payload_hash(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class _Server:
    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {**os.environ, "KILLTEST_TOKEN": TOKEN}

    def start(self) -> None:
        log = open(self.root / "serve.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "afterword.cli", "serve", "--config", str(self.root / "afterword.json")],
            stdout=log,
            stderr=log,
            env=self.env,
        )
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("afterword serve exited during start; see serve.log")
            try:
                httpx.get(self.base + "/v1/operator/health", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("afterword serve did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def _write_config(root: Path, port: int) -> None:
    os.chmod(root, 0o700)
    doc = {
        "continuations": {
            "port": port,
            "stateDir": "state",
            "namedRoutes": {"load": {"mode": "notify_if_actionable", "conversationId": "load:room"}},
            "detachedServices": [{"name": "loadgen", "tokenEnv": "KILLTEST_TOKEN"}],
        }
    }
    (root / "afterword.json").write_text(json.dumps(doc))


class _Producers:
    def __init__(self, base: str, total: int, threads: int) -> None:
        self.base = base
        self.total = total
        self.threads = threads
        self.lock = threading.Lock()
        self.next = 0
        self.claims: dict[str, dict[str, Any]] = {}  # task key -> acknowledged claim response
        self.results: set[str] = set()  # continuation ids whose result was acknowledged
        self.stop = threading.Event()
        self.deadline = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    def _call(self, client: httpx.Client, method: str, url: str, **kw: Any) -> httpx.Response | None:
        """Retry connection failures (the server may be down) until stopped; both calls are idempotent."""
        while not self.stop.is_set():
            try:
                return client.request(method, url, **kw)
            except httpx.HTTPError:
                time.sleep(0.05)
        return None

    def _one(self, client: httpx.Client, index: int) -> None:
        key = f"job-{index:05d}"
        r = self._call(
            client,
            "POST",
            self.base + "/v1/continuations/detached/claim",
            headers={"Authorization": f"Bearer {TOKEN}", "X-Mono-Agent-Service-Name": "loadgen"},
            json={"route": "load", "taskKey": key, "taskHash": "h-" + key, "deadline": self.deadline},
        )
        if r is None or r.status_code != 200:
            return
        claim = r.json()
        with self.lock:
            self.claims[key] = claim
        payload = {"summary": f"finished {key}"}
        body = {"idempotencyKey": "r-" + key, "payloadHash": _payload_hash(payload), "payload": payload}
        r = self._call(
            client, "PUT", claim["resultUrl"], headers={"Authorization": "Bearer " + claim["resultToken"]}, json=body
        )
        if r is not None and r.status_code == 200:
            with self.lock:
                self.results.add(claim["continuationId"])

    def _worker(self) -> None:
        with httpx.Client(timeout=10, trust_env=False) as client:
            while not self.stop.is_set():
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
    *, kills: int = 5, continuations: int = 300, threads: int = 4, seed: int | None = None, workdir: str | None = None
) -> KillReport:
    """Run the kill test; every run is reproducible in its kill schedule from ``seed``."""
    seed = seed if seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="afterword-killtest-", dir=workdir))
    port = _free_port()
    _write_config(root, port)
    server = _Server(root, port)
    server.start()
    load = _Producers(server.base, continuations, threads)
    workers = load.run()
    done_kills = 0
    while done_kills < kills and any(t.is_alive() for t in workers):
        time.sleep(rng.uniform(0.2, 1.2))
        server.kill()
        done_kills += 1
        server.start()
    for t in workers:
        t.join(timeout=120)
    load.stop.set()
    report = _check(server, load, seed, done_kills)
    server.stop()
    report.seconds = round(time.monotonic() - began, 2)
    return report


def _check(server: _Server, load: _Producers, seed: int, kills: int) -> KillReport:
    client = httpx.Client(timeout=10, trust_env=False)
    statuses: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    end = time.monotonic() + 60
    pending = dict(load.claims)
    while pending and time.monotonic() < end:  # let the worker drain
        for key, claim in list(pending.items()):
            r = client.get(claim["statusUrl"], headers={"Authorization": "Bearer " + claim["resultToken"]})
            if r.status_code != 200:
                continue
            body = r.json()
            statuses[key] = body
            if body["state"] in TERMINAL or (body["state"] == "claimed" and body["continuationId"] not in load.results):
                del pending[key]
        if pending:
            time.sleep(0.2)
    lost = 0
    for key, claim in load.claims.items():
        st = statuses.get(key)
        if st is None:
            lost += 1
            problems.append(f"claim {key} acknowledged but unknown")
        elif claim["continuationId"] in load.results and st["state"] == "claimed":
            lost += 1
            problems.append(f"result of {key} acknowledged but not recorded")
    lines = []
    outbox = server.root / "outbox.jsonl"
    if outbox.exists():
        lines = [json.loads(line) for line in outbox.read_text().splitlines() if line.strip()]
    keys = Counter(line["deliveryKey"] for line in lines)
    duplicated = sum(n - 1 for n in keys.values() if n > 1)
    states = Counter(st["state"] for st in statuses.values())
    stuck = sum(1 for key in pending if load.claims[key]["continuationId"] in load.results)
    if stuck:
        problems.append(f"{stuck} continuation(s) with a result never reached a terminal state")
    token = _operator_token(server.root)
    health = client.get(server.base + "/v1/operator/health", headers={"Authorization": "Bearer " + token}).json()
    expected = (
        "unhealthy"
        if states.get("dead_lettered") or states.get("delivery_unknown")
        else "degraded"
        if any(s not in TERMINAL for s in states.elements()) or states.get("expired")
        else "healthy"
    )
    consistent = health["status"] == expected
    if not consistent:
        problems.append(f"health {health['status']} but the states say {expected}")
    client.close()
    return KillReport(
        seed=seed,
        kills=kills,
        continuations=len(load.claims),
        acknowledged_claims=len(load.claims),
        acknowledged_results=len(load.results),
        lost=lost,
        duplicated=duplicated,
        stuck=stuck,
        states=dict(states),
        health=health["status"],
        health_consistent=consistent,
        problems=problems,
    )


def _operator_token(root: Path) -> str:
    from afterword.config import load_config
    from afterword.operator import read_operator_token

    return read_operator_token(load_config(root / "afterword.json", check_secrets=False))


def report_json(report: KillReport) -> str:
    return json.dumps({**asdict(report), "ok": report.ok}, indent=2)

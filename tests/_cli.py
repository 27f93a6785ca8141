"""Helpers to run `afterword serve` and the operator CLI as real subprocesses."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from _service import DETACHED_TOKEN, deadline, free_port, payload_hash

CLI = [sys.executable, "-m", "afterword.cli"]


class FakeWebhook:
    """A webhook receiver whose answer depends on the conversation id it is sent."""

    def __init__(self, hang_s: float = 5.0) -> None:
        self.received: list[dict[str, Any]] = []
        self.hang_s = hang_s
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.received.append({**body, "idempotencyKey": self.headers.get("Idempotency-Key")})
                conv = body["conversationId"]
                if conv.endswith(":refuse"):
                    status, answer = 400, {"error": "refused"}
                elif conv.endswith(":hang"):
                    time.sleep(outer.hang_s)
                    status, answer = 200, {"id": "late"}
                else:
                    status, answer = 200, {"id": f"wh-{len(outer.received)}"}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, conversation_suffix: str) -> int:
        with self._lock:
            return sum(1 for r in self.received if r["conversationId"].endswith(conversation_suffix))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_operator_config(root: Path, hook_url: str, **continuations: Any) -> Path:
    os.chmod(root, 0o700)
    (root / "mcp.json").write_text(json.dumps({"mcpServers": {"work-control": {"command": "true"}}}))
    block: dict[str, Any] = {
        "port": free_port(),
        "stateDir": "state",
        "limits": {"deliveryTimeoutMs": 1500, "operatorPageSize": 100},
        "namedRoutes": {
            "ok": {"mode": "notify_if_actionable", "conversationId": "hook:ok"},
            "refuse": {"mode": "notify_if_actionable", "conversationId": "hook:refuse"},
            "hang": {"mode": "notify_if_actionable", "conversationId": "hook:hang"},
            "capture": {"mode": "capture", "conversationId": "local:capture"},
            "quiet": {"mode": "silent"},
        },
        "detachedServices": [{"name": "svc", "tokenEnv": "AFTERWORD_TEST_DETACHED_TOKEN"}],
        "channels": {"hook": {"adapter": "webhook", "url": hook_url}, "*": {"adapter": "outbox"}},
    }
    for key, value in continuations.items():
        if isinstance(value, dict) and isinstance(block.get(key), dict):
            block[key] = {**block[key], **value}
        else:
            block[key] = value
    doc = {
        "tools": {"mcpConfigPath": "./mcp.json", "continuationServers": ["work-control"]},
        "continuations": block,
    }
    path = root / "afterword.json"
    path.write_text(json.dumps(doc))
    return path


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["AFTERWORD_TEST_DETACHED_TOKEN"] = DETACHED_TOKEN
    return e


def run_cli(
    *args: str, config: Path | None = None, timeout: float = 30, without_tokens: bool = False
) -> subprocess.CompletedProcess[str]:
    argv = [*CLI, *args]
    if config is not None:
        argv += ["--config", str(config)]
    e = env()
    if without_tokens:
        e.pop("AFTERWORD_TEST_DETACHED_TOKEN", None)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=e)


def run_printed(command: str) -> subprocess.CompletedProcess[str]:
    """Run a command line the CLI printed (``afterword ...``) with this interpreter."""
    argv = shlex.split(command)
    assert argv[0] == "afterword"
    return subprocess.run([*CLI, *argv[1:]], capture_output=True, text=True, timeout=30, env=env())


class Server:
    def __init__(self, config: Path) -> None:
        self.config = config
        doc = json.loads(config.read_text())
        self.base = f"http://127.0.0.1:{doc['continuations']['port']}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(timeout=10)

    def start(self) -> None:
        log = open(self.config.parent / "serve.log", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [*CLI, "serve", "--config", str(self.config)], stdout=log, stderr=log, env=env()
        )
        deadline_t = time.monotonic() + 20
        while time.monotonic() < deadline_t:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited early: {(self.config.parent / 'serve.log').read_text()}")
            try:
                self.http.get(self.base + "/v1/operator/health")
                return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("serve did not start")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self.proc = None
        return code

    def log(self) -> str:
        return (self.config.parent / "serve.log").read_text()

    def claim(self, route: str, task_key: str) -> dict[str, Any]:
        r = self.http.post(
            self.base + "/v1/continuations/detached/claim",
            headers={"Authorization": f"Bearer {DETACHED_TOKEN}", "X-Mono-Agent-Service-Name": "svc"},
            json={"route": route, "taskKey": task_key, "taskHash": "h-" + task_key, "deadline": deadline()},
        )
        assert r.status_code == 200, r.text
        return dict(r.json())

    def result(self, claim: dict[str, Any], payload: Any) -> dict[str, Any]:
        r = self.http.put(
            claim["resultUrl"],
            headers={"Authorization": f"Bearer {claim['resultToken']}"},
            json={
                "idempotencyKey": "k-" + claim["continuationId"],
                "payloadHash": payload_hash(payload),
                "payload": payload,
            },
        )
        assert r.status_code == 200, r.text
        return dict(r.json())

    def status(self, claim: dict[str, Any]) -> dict[str, Any]:
        r = self.http.get(claim["statusUrl"], headers={"Authorization": f"Bearer {claim['resultToken']}"})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait_state(self, claim: dict[str, Any], *states: str, timeout: float = 20) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while True:
            st = self.status(claim)
            if st["state"] in states:
                return st
            if time.monotonic() > end:
                raise AssertionError(f"state {st['state']} never became one of {states}")
            time.sleep(0.05)


@contextmanager
def served(config: Path) -> Iterator[Server]:
    server = Server(config)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None:
            server.stop()


def cli(server: Server, *args: str) -> tuple[int, str, str]:
    """Run the CLI against ``server``'s config: (exit code, stdout, stderr)."""
    done = run_cli(*args, config=server.config)
    return done.returncode, done.stdout, done.stderr

"""Run ``afterword serve`` as a real subprocess, SIGKILL it, and drive it over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
from _service import DETACHED_TOKEN, deadline, payload_hash

from afterword.clients.operator import read_operator_token
from afterword.config import Config
from afterword.protocol.paths import METRICS

REPO = Path(__file__).resolve().parent.parent
TERMINAL = ("delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered")


class ServeProcess:
    """One ``python -m afterword.cli serve --config PATH`` child; stderr goes to ``log``."""

    def __init__(self, config_path: Path, environ: Mapping[str, str], log: Path) -> None:
        self.config_path = config_path
        self.environ = {**os.environ, **environ, "PYTHONPATH": str(REPO)}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> ServeProcess:
        if self.proc is not None:
            raise RuntimeError("this serve process is already running")
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "afterword.cli", "serve", "--config", str(self.config_path)],
                env=self.environ,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        end = time.monotonic() + timeout
        while b"afterword serving on" not in self.log.read_bytes()[offset:]:
            if self.proc.poll() is not None or time.monotonic() > end:
                self.kill()
                raise RuntimeError("serve did not start:\n" + self.log.read_text()[-2000:])
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        """SIGKILL by pid: no drain, no shielded cleanup, exactly like a power cut of the process."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


class DetachedProducer:
    """A detached service claiming a named route and submitting one result (sync HTTP)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.client = httpx.Client(timeout=10)

    def claim(self, route: str, task_key: str) -> dict[str, Any]:
        response = self.client.post(
            f"{self.base_url}/v1/continuations/detached/claim",
            headers={
                "Authorization": f"Bearer {DETACHED_TOKEN}",
                "X-Mono-Agent-Service-Name": "work-control",
            },
            json={"route": route, "taskKey": task_key, "taskHash": "h-" + task_key, "deadline": deadline()},
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def submit(self, claim: Mapping[str, Any], payload: Any) -> None:
        response = self.client.put(
            claim["resultUrl"],
            headers={"Authorization": f"Bearer {claim['resultToken']}"},
            json={"idempotencyKey": "result-1", "payloadHash": payload_hash(payload), "payload": payload},
        )
        assert response.status_code == 200, response.text

    def status(self, claim: Mapping[str, Any]) -> dict[str, Any]:
        response = self.client.get(
            claim["statusUrl"], headers={"Authorization": f"Bearer {claim['resultToken']}"}
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def wait_state(
        self, claim: Mapping[str, Any], states: tuple[str, ...] = TERMINAL, timeout: float = 20
    ) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while True:
            status = self.status(claim)
            if status["state"] in states:
                return status
            if time.monotonic() > end:
                raise TimeoutError(f"still {status['state']}")
            time.sleep(0.05)

    def close(self) -> None:
        self.client.close()


def after_full_scan(config: Config, timeout: float = 30.0) -> None:
    """Return once the served worker loop has made a full scan that began after this call and
    has nothing queued or in progress, read from its metrics: whatever the worker would do with
    the records as they stand (even wrongly) has then been done, without guessing a duration."""

    def read() -> tuple[float, float]:
        text = httpx.get(
            config.base_url + METRICS,
            headers={"Authorization": f"Bearer {read_operator_token(config)}"},
            timeout=10,
        ).text
        values = dict(
            line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("afterword_worker_")
        )
        return float(values["afterword_worker_scans_total"]), float(values["afterword_worker_queue_depth"])

    # The scrape runs on the worker's event loop and a scan's dispatch never awaits, so any scan
    # counted after this first read began after it.
    seen, _ = read()
    end = time.monotonic() + timeout
    while True:
        scans, depth = read()
        if scans > seen and depth == 0:
            return
        if time.monotonic() > end:
            raise TimeoutError(f"the worker made {scans - seen:.0f} full scans in {timeout} s")
        time.sleep(0.05)

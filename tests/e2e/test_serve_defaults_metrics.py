"""`afterword serve` on built-in defaults, and the Prometheus metrics endpoint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest
from _service import DETACHED_TOKEN, ENV, deadline, load, payload_hash, write_config

import afterword


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.timeout(60)
def test_serve_with_no_config_uses_documented_defaults(tmp_path: Path) -> None:
    if not _port_free(4319):
        pytest.skip("the documented default port 4319 is in use on this machine")
    os.chmod(tmp_path, 0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFTERWORD")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "afterword.cli", "serve"], cwd=tmp_path, env=env, stderr=subprocess.PIPE
    )
    try:
        end = time.monotonic() + 20
        while True:
            try:
                httpx.get("http://127.0.0.1:4319/v1/operator/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < end and proc.poll() is None
                time.sleep(0.05)
        done = subprocess.run(
            [sys.executable, "-m", "afterword.cli", "continuations", "health"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0 and done.stdout.startswith("healthy")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    state = tmp_path / ".mono-agent" / "continuations"
    assert (state / "MANIFEST").is_file() and (state / "secret").stat().st_mode & 0o777 == 0o600
    assert state.stat().st_mode & 0o777 == 0o700


@pytest.mark.anyio
async def test_metrics_endpoint(tmp_path: Path) -> None:
    from afterword.protocol.wire import DetachedClaimRequest, ResultRequest

    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV) as service, httpx.AsyncClient() as client:
        claim = await service.detached_claim(
            "work-control",
            DETACHED_TOKEN,
            DetachedClaimRequest(route="daily-attention", task_key="m1", task_hash="h", deadline=deadline()),
        )
        payload = {"summary": "ok"}
        await service.submit_result(
            claim.continuation_id,
            claim.result_token,
            ResultRequest(idempotency_key="k", payload_hash=payload_hash(payload), payload=payload),
            10,
        )
        with anyio.fail_after(10):
            while service.repo.state_counts.get("delivered", 0) < 1:
                await anyio.sleep(0.01)
        url = service.base_url + "/v1/operator/metrics"
        assert (await client.get(url)).status_code == 401
        assert (
            await client.get(url, headers={"Authorization": "Bearer " + claim.result_token})
        ).status_code == 401
        r = await client.get(url, headers={"Authorization": "Bearer " + service.operator_token()})
        assert r.status_code == 200
        text = r.text
        assert 'afterword_continuations{state="delivered"} 1.0' in text
        assert "afterword_health 0.0" in text
        assert 'afterword_wal_fsync_seconds_bucket{le="+Inf"}' in text
        assert "afterword_wal_commits_total" in text and "afterword_recovery_seconds" in text
        assert "afterword_worker_queue_depth" in text and "afterword_checkpoint_last_seconds" in text
        assert "afterword_worker_scans_total 0.0" not in text  # the loop has scanned at least once

"""Every client of the loopback service ignores proxy environment variables.

Each request to afterword carries a credential (the operator capability, a claim or result
token, a run's capability headers). A proxy named in ``HTTP_PROXY``/``ALL_PROXY`` would
receive it, so every client is pointed at a fake proxy that records whatever reaches it, and
must succeed without that proxy seeing a byte.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from _service import ENV, deadline, load, write_config

import afterword
from afterword.clients.operator import OperatorClient, read_operator_token
from afterword.mcp_host import http_client
from afterword.producer import ClaimCapability, Producer, task_hash

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


class RecordingProxy:
    """A TCP listener that records every byte a client sends it and answers 502."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                with self._lock:
                    self.connections += 1
                try:
                    data = conn.recv(65536)
                    with self._lock:
                        self.received += data
                    conn.sendall(
                        b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                except OSError:
                    pass

    def close(self) -> None:
        self._sock.close()

    def assert_untouched(self) -> None:
        with self._lock:
            assert self.connections == 0 and not self.received, bytes(self.received[:200])


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingProxy]:
    fake = RecordingProxy()
    for name in PROXY_VARS:
        monkeypatch.setenv(name, fake.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield fake
    fake.close()


def test_the_fake_proxy_would_see_a_trusting_client(proxy: RecordingProxy) -> None:
    """Control: a default httpx client does send a loopback request to the proxy, so the
    tests below would fail if a client trusted the environment."""
    import httpx

    with httpx.Client(timeout=5) as client:
        response = client.get("http://127.0.0.1:9/v1/operator/health", headers={"Authorization": "Bearer s"})
    assert response.status_code == 502
    assert b"Bearer s" in proxy.received


@pytest.mark.anyio
async def test_operator_client_ignores_proxy_variables(tmp_path: Path, proxy: RecordingProxy) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, run_worker=False):

        def call() -> str:
            client = OperatorClient(config, read_operator_token(config))
            try:
                return client.health().status
            finally:
                client.close()

        assert await anyio.to_thread.run_sync(call) == "healthy"
    proxy.assert_untouched()


@pytest.mark.anyio
async def test_operator_cli_ignores_proxy_variables(tmp_path: Path, proxy: RecordingProxy) -> None:
    path = write_config(tmp_path)
    config = load(path)
    async with afterword.open_service(config, environ=ENV, run_worker=False):
        env = {**os.environ, **ENV}
        result = await anyio.run_process(
            [sys.executable, "-m", "afterword.cli", "continuations", "health", "--config", str(path)],
            env=env,
            check=False,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    assert result.returncode == 0, result.stderr.decode()
    proxy.assert_untouched()


@pytest.mark.anyio
async def test_producer_ignores_proxy_variables(tmp_path: Path, proxy: RecordingProxy) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat#1", "local:chat")
        cap = ClaimCapability.from_env(binding.stdio_env("work-control"))
        assert cap is not None
        async with Producer() as producer:
            handle = await producer.claim(cap, task_key="k", task_hash=task_hash("t"), deadline=deadline())
            assert (await handle.status()).state == "claimed"
    proxy.assert_untouched()


@pytest.mark.anyio
async def test_host_http_client_ignores_proxy_variables(tmp_path: Path, proxy: RecordingProxy) -> None:
    """The host helper's client carries the run's capability headers to a loopback MCP server;
    pointed at the service itself (any loopback listener will do), it must connect directly."""
    config = load(
        write_config(tmp_path, servers={"web": {"url": "http://127.0.0.1:9/mcp"}}, selected=["web"])
    )
    async with afterword.open_service(config, environ=ENV, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat#1", "local:chat")
        async with http_client(binding, config.mcp_servers["web"]) as client:
            response = await client.get(service.base_url + "/v1/operator/health")
        assert response.status_code == 401  # the service itself answered, not the proxy
    proxy.assert_untouched()

"""Connection-level defences: malformed requests still get the JSON envelope, connections
are capped (beyond the reserved slots) with a clear refusal, bodies have a deadline and a failing accept is logged once
per burst rather than once per attempt."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from _service import DETACHED_TOKEN, free_port, write_config
from test_http_protocol import Harness, _raw_exchange, _result_head, serving

from afterword.http.acceptor import (
    MAX_REFUSALS_IN_FLIGHT,
    RESERVED_DESCRIPTORS,
    RESERVED_SLOTS,
    AcceptLoop,
    connection_cap,
)
from afterword.http.metrics import render_metrics

pytestmark = pytest.mark.anyio


def acceptor_of(h: Harness) -> AcceptLoop:
    acceptor: AcceptLoop | None = h.service.http_server.acceptor  # type: ignore[attr-defined]
    assert acceptor is not None
    return acceptor


async def _exchange(port: int, raw: bytes) -> tuple[str, dict[str, Any]]:
    return await _raw_exchange(port, raw, [])


# -- item 5: malformed requests ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "status", "code"),
    [
        ("negative content-length", 400, "invalid_request"),
        ("non-numeric content-length", 400, "invalid_request"),
        ("control character in the request line", 400, "invalid_request"),
        ("100 KB URL", 431, "too_large"),
        ("100 KB header", 431, "too_large"),
        ("20 KB header in one read", 431, "too_large"),
        ("20 KB URL in one read", 431, "too_large"),
        ("not HTTP at all", 400, "invalid_request"),
    ],
)
async def test_malformed_requests_get_the_json_envelope(
    tmp_path: Path, name: str, status: int, code: str
) -> None:
    async with serving(tmp_path) as h:
        host = f"Host: 127.0.0.1:{h.config.port}\r\n"
        raw = {
            "negative content-length": f"POST /v1/continuations/claim HTTP/1.1\r\n{host}Content-Length: -5\r\n\r\n",
            "non-numeric content-length": f"POST /v1/continuations/claim HTTP/1.1\r\n{host}Content-Length: 12abc\r\n\r\n",
            "control character in the request line": f"GET /v1/oper\x01ator/health HTTP/1.1\r\n{host}\r\n",
            "100 KB URL": f"GET /v1/continuations/{'a' * 100_000} HTTP/1.1\r\n{host}\r\n",
            "100 KB header": f"GET /v1/operator/health HTTP/1.1\r\n{host}X-Big: {'b' * 100_000}\r\n\r\n",
            # Over the 16 KiB head limit but inside one 64 KiB read, which h11 never sees as incomplete
            "20 KB header in one read": f"GET /v1/livez HTTP/1.1\r\n{host}X-Big: {'b' * 20_000}\r\n\r\n",
            "20 KB URL in one read": f"GET /v1/livez?{'a' * 20_000} HTTP/1.1\r\n{host}\r\n",
            "not HTTP at all": "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
        }[name]
        line, body = await _exchange(h.config.port, raw.encode("latin-1"))
        assert line.startswith(f"HTTP/1.1 {status}"), line
        assert set(body) == {"error"} and body["error"]["code"] == code and body["error"]["message"]


# -- item 3: connection cap, body deadline, accept failures -------------------------------------
async def test_connections_beyond_the_cap_and_the_reserve_are_refused_with_503(tmp_path: Path) -> None:
    async with serving(tmp_path, limits={"maxConnections": 4}) as h:
        port = h.config.port
        operator = h.service.operator_token().encode()
        ask = b"GET /v1/operator/health HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n\r\n"
        held = []
        for _ in range(4 + RESERVED_SLOTS):  # each credentialed before the next: none may be evicted
            stream = await anyio.connect_tcp("127.0.0.1", port)
            held.append(stream)
            await stream.send(ask % (port, operator))
            assert (await stream.receive()).startswith(b"HTTP/1.1 200")
        acceptor = acceptor_of(h)
        assert acceptor.active == 4 + RESERVED_SLOTS
        request = f"GET /v1/operator/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        line, body = await _exchange(port, request)
        assert line.startswith("HTTP/1.1 503"), line
        assert body["error"]["code"] == "too_many_connections"
        assert acceptor.refused >= 1
        metrics = render_metrics(h.service).decode()
        assert f"afterword_http_connections {4 + RESERVED_SLOTS}.0" in metrics
        assert "afterword_http_connections_refused_total 1.0" in metrics
        for stream in held:
            await stream.aclose()
        with anyio.fail_after(10):
            while acceptor.active > 0:
                await anyio.sleep(0.01)
        line, body = await _exchange(port, request)
        assert line.startswith("HTTP/1.1 401"), line  # served again (no operator credential sent)


async def test_a_trickled_body_is_cut_off_at_the_deadline(tmp_path: Path) -> None:
    async with serving(tmp_path, limits={"bodyTimeoutMs": 300}) as h:
        claim = await h.claimed(h.bind()[1])
        head = _result_head(h, claim, "Content-Length: 1000")
        acceptor = acceptor_of(h)
        baseline = acceptor.active  # the harness client's keep-alive connection
        started = time.monotonic()
        line, body = await _raw_exchange(h.config.port, head, [b'{"idempotencyKey":'])
        assert line.startswith("HTTP/1.1 408"), line
        assert body["error"]["code"] == "timeout"
        assert time.monotonic() - started < 8  # well before the 30 s keep-alive bound
        with anyio.fail_after(10):
            while acceptor.active > baseline:  # the trickling connection was let go
                await anyio.sleep(0.01)
        assert (await h.status(claim)).json()["state"] == "claimed"


async def test_accept_failures_are_logged_once_per_burst(caplog: pytest.LogCaptureFixture) -> None:
    left, right = socket.socketpair()
    script: list[OSError | socket.socket] = [OSError(errno.EMFILE, "Too many open files")] * 500 + [left]
    handled: list[socket.socket] = []
    done = asyncio.Event()

    async def accept() -> socket.socket:
        if not script:
            done.set()
            await asyncio.Event().wait()
        step = script.pop(0)
        if isinstance(step, OSError):
            raise step
        return step

    async def handle(conn: socket.socket) -> None:
        handled.append(conn)

    async def no_sleep(_: float) -> None:
        await asyncio.sleep(0)

    loop = AcceptLoop(accept, handle, 8, sleep=no_sleep)
    caplog.set_level(logging.WARNING, logger="afterword.http")
    task = asyncio.ensure_future(loop.run())
    with anyio.fail_after(10):
        await done.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    right.close()
    assert handled == [left] and loop.accept_failures == 500
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages  # the clock did not move: one line for 500 failures
    assert "Too many open files" in messages[0] and "1 failed attempts" in messages[0]


def test_the_cap_fits_under_the_descriptor_limit() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert 1 <= connection_cap(10**9) <= soft - RESERVED_DESCRIPTORS - MAX_REFUSALS_IN_FLIGHT - RESERVED_SLOTS
    assert connection_cap(5) == 5


def test_serve_under_a_low_descriptor_limit_refuses_cleanly(tmp_path: Path) -> None:
    """The reported run wrote 21,355 tracebacks in 15 s with a low descriptor limit. Here 300
    connections meet a server limited to 192 descriptors: the excess is refused with a 503
    and the log stays a handful of lines."""
    port = free_port()
    path = write_config(tmp_path, continuations={"port": port, "limits": {"maxConnections": 1000}})

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (192, 192))

    env = {**os.environ, "AFTERWORD_TEST_DETACHED_TOKEN": DETACHED_TOKEN}
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "afterword.cli", "serve", "--config", str(path)],
            stdout=log,
            stderr=log,
            env=env,
            preexec_fn=low_limit,
        )
    try:
        _wait_listening(port, proc)
        conns: list[socket.socket] = []
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            conns.append(s)
        # At most this many may be held open; every other connection must be answered 503.
        held_at_most = 192 - RESERVED_DESCRIPTORS - MAX_REFUSALS_IN_FLIGHT
        refused = _count_refusals(conns, wanted=300 - held_at_most, within=15)
        assert 300 - refused <= held_at_most, refused
        for s in conns:
            s.close()
        # Served again once the crowd is gone (the server notices the closes promptly).
        end = time.monotonic() + 15
        answer = b""
        while time.monotonic() < end and not answer.startswith(b"HTTP/1.1 401"):
            time.sleep(0.1)
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(f"GET /v1/operator/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                answer = s.recv(64)
        assert answer.startswith(b"HTTP/1.1 401"), answer
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = log_path.read_text().splitlines()
    assert len(lines) < 10, lines
    assert not any("cannot accept" in line for line in lines), lines  # the cap kept clear of the limit
    assert not any("Traceback" in line for line in lines)
    for line in lines:
        if line.startswith("{"):
            json.loads(line)


def _count_refusals(conns: list[socket.socket], wanted: int, within: float) -> int:
    """Count the connections answered with a 503, reading each as its answer arrives, until
    ``wanted`` are counted or ``within`` seconds pass (a bound, not a pace: it returns early)."""
    refused = 0
    with selectors.DefaultSelector() as sel:
        for s in conns:
            sel.register(s, selectors.EVENT_READ)
        end = time.monotonic() + within
        while refused < wanted and sel.get_map() and (left := end - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                sel.unregister(s)
                try:
                    refused += s.recv(16).startswith(b"HTTP/1.1 503")
                except OSError:
                    pass
    return refused


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + 20
    while time.monotonic() < end:
        assert proc.poll() is None, "serve exited early"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("serve did not start")


# -- issue 20: no Nagle stall on keep-alive responses -------------------------------------------
def _server_side_nodelay(client_addr: tuple[str, int]) -> int:
    """TCP_NODELAY of this process's socket whose peer is ``client_addr`` (the served side)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            probe = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        with probe:
            try:
                if probe.type != socket.SOCK_STREAM or probe.getpeername() != client_addr:
                    continue
            except OSError:
                continue
            return probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    raise AssertionError(f"no served socket with peer {client_addr}")


async def test_served_connections_have_nagle_off(tmp_path: Path) -> None:
    # With Nagle on, each keep-alive response's body waited ~40 ms for a delayed ACK (h11
    # writes head and body separately): 1-producer throughput fell to a tenth.
    async with serving(tmp_path) as h, await anyio.connect_tcp("127.0.0.1", h.config.port) as stream:
        await stream.send(b"GET /v1/operator/health HTTP/1.1\r\nHost: x\r\n\r\n")
        await stream.receive()
        local = stream.extra(anyio.abc.SocketAttribute.local_address)
        assert _server_side_nodelay((str(local[0]), int(local[1]))) != 0

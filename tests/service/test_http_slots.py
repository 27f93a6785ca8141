"""Issue 33, point 2: the transport speaks HTTP/1.1 only, and connections that prove nothing
cannot keep the operator (or a credentialed caller) out.

Everything runs on loopback against an embedded ``serve`` with a small connection cap; no
test waits for a fixed time: each waits (bounded) for the server to act."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from test_http_protocol import serving

import afterword.http.acceptor as acceptor_module

pytestmark = pytest.mark.anyio

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # empty SETTINGS, stream 0


class Conn:
    """One raw keep-alive connection that reads whole responses."""

    def __init__(self, stream: anyio.abc.SocketStream, port: int) -> None:
        self.stream, self.port, self.buffer = stream, port, b""

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(await anyio.connect_tcp("127.0.0.1", port), port)

    async def ask(self, method: str, path: str, token: str | None = None, extra: str = "") -> tuple[int, Any]:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        # No framing header on a GET: hypercorn ignores an h2c upgrade that has one.
        length = "" if method == "GET" else "Content-Length: 0\r\n"
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n{auth}{extra}{length}\r\n"
        await self.stream.send(head.encode())
        return await self.answer()

    async def answer(self) -> tuple[int, Any]:
        with anyio.fail_after(10):
            while b"\r\n\r\n" not in self.buffer:
                self.buffer += await self.stream.receive()
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            fields = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
            length = int(fields.get("content-length", "0"))
            while len(rest) < length:
                rest += await self.stream.receive()
            self.buffer = rest[length:]
            body = json.loads(rest[:length]) if length else None
            return int(lines[0].split()[1]), body

    async def closed_by_server(self) -> bool:
        """Wait (bounded) until the server ends the connection; anything it says first is read."""
        with anyio.fail_after(10):
            try:
                while await self.stream.receive():
                    pass
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                return True
        return True

    async def aclose(self) -> None:
        await self.stream.aclose()


async def test_http2_prior_knowledge_is_not_spoken(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        stream = await anyio.connect_tcp("127.0.0.1", h.config.port)
        async with stream:
            await stream.send(H2_PREFACE + H2_SETTINGS_FRAME)
            received = b""
            with anyio.fail_after(10):
                try:
                    while True:
                        received += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                    pass
        # An HTTP/2 server answers with its SETTINGS frame; here the preface is an HTTP/1.1
        # request with target ``*``, refused with the JSON envelope, and the connection ends.
        assert received.startswith(b"HTTP/1.1 400"), received[:40]
        assert b'"invalid_request"' in received


async def test_an_h2c_upgrade_is_ignored_and_answered_in_http11(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        conn = await Conn.open(h.config.port)
        upgrade = (
            "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
        )
        status, body = await conn.ask("GET", "/v1/livez", extra=upgrade)
        assert status == 200 and body is not None  # not 101 Switching Protocols
        # Still HTTP/1.1 on the same connection.
        assert (await conn.ask("GET", "/v1/livez"))[0] == 200
        await conn.aclose()


async def test_livez_pollers_holding_every_slot_do_not_keep_a_credentialed_caller_out(tmp_path: Path) -> None:
    async with serving(tmp_path, limits={"maxConnections": 4}) as h:
        port = h.config.port
        pollers = [await Conn.open(port) for _ in range(4)]
        for poller in pollers:
            assert (await poller.ask("GET", "/v1/livez"))[0] == 200
        acceptor = h.service.http_server.acceptor  # type: ignore[union-attr]
        assert acceptor is not None and acceptor.active >= 4
        # A host (credentialed) comes in: the oldest poller that proved nothing makes room.
        host = await Conn.open(port)
        status, _ = await host.ask("GET", "/v1/operator/health", h.service.operator_token())
        assert status == 200
        assert await pollers[0].closed_by_server()
        assert acceptor.evicted >= 1
        for conn in [host, *pollers]:
            await conn.aclose()


async def test_the_operator_gets_a_reserved_slot_when_credentialed_callers_hold_every_one(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, limits={"maxConnections": 2}) as h:
        port, operator = h.config.port, h.service.operator_token()
        holders = [await Conn.open(port) for _ in range(2)]
        for holder in holders:  # credentialed: not evictable
            assert (await holder.ask("GET", "/v1/operator/health", operator))[0] == 200
        # The operator's CLI still gets in (a reserved slot) ...
        op = await Conn.open(port)
        assert (await op.ask("GET", "/v1/operator/health", operator))[0] == 200
        # ... and so does a liveness probe, which is then let go at once.
        probe = await Conn.open(port)
        assert (await probe.ask("GET", "/v1/livez"))[0] == 200
        assert await probe.closed_by_server()
        # A reserved slot is for the operator and probes only; a stranger there is let go too.
        other = await Conn.open(port)
        status, body = await other.ask("GET", "/v1/continuations/x")
        assert status == 503 and body["error"]["code"] == "too_many_connections"
        assert await other.closed_by_server()
        # Past the reserve as well: refused at the door.
        extra = [await Conn.open(port) for _ in range(acceptor_module.RESERVED_SLOTS)]
        status, body = await extra[-1].answer()
        assert status == 503 and body["error"]["code"] == "too_many_connections"
        for conn in [op, *holders, *extra]:
            await conn.aclose()


async def test_a_connection_without_a_credentialed_request_is_dropped_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough that each connection's one request is answered before its grace ends.
    monkeypatch.setattr(acceptor_module, "UNCREDENTIALED_GRACE_S", 3.0)
    async with serving(tmp_path) as h:
        port = h.config.port
        credentialed = await Conn.open(port)
        assert (await credentialed.ask("GET", "/v1/operator/health", h.service.operator_token()))[0] == 200
        poller, stranger, silent = await Conn.open(port), await Conn.open(port), await Conn.open(port)
        assert (await poller.ask("GET", "/v1/livez"))[0] == 200
        # A credential the route refuses proves nothing either.
        assert (await stranger.ask("GET", "/v1/operator/health", "awc1.x.y"))[0] == 401
        for conn in (poller, stranger, silent):
            assert await conn.closed_by_server()
        # The credentialed connection was opened first, so its grace ran out first: it stays.
        assert (await credentialed.ask("GET", "/v1/livez"))[0] == 200
        for conn in (credentialed, poller, stranger, silent):
            await conn.aclose()


async def test_the_accept_loop_evicts_the_oldest_unproven_then_reserves_then_refuses() -> None:
    """The bookkeeping alone, on socket pairs: who is evicted, who is reserved, who is
    refused, and that every count returns to zero when the connections end."""
    pairs = [socket.socketpair() for _ in range(5)]
    queue: asyncio.Queue[socket.socket] = asyncio.Queue()

    async def handle(conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:  # like hypercorn: serve until the peer (or our eviction) ends the stream
            while await loop.sock_recv(conn, 4096):
                pass
        except OSError:
            pass

    loop = acceptor_module.AcceptLoop(queue.get, handle, 2, reserved=1, grace_s=60)
    task = asyncio.ensure_future(loop.run())
    served = [server for server, _ in pairs]
    for server in served:
        server.setblocking(False)

    async def admit(server: socket.socket) -> None:
        await queue.put(server)
        await anyio.wait_all_tasks_blocked()  # the loop took it and decided its slot

    await admit(served[0])
    await admit(served[1])
    first = loop.slot_of(("", served[0].fileno()))
    second = loop.slot_of(("", served[1].fileno()))
    assert first is not None and second is not None and loop.active == 2
    second.credentialed = True
    # Full: the oldest connection that proved nothing (the first) gives up its slot.
    await admit(served[2])
    assert loop.evicted == 1 and loop.slot_of(("", served[0].fileno())) is None
    with anyio.fail_after(10):
        assert pairs[0][1].recv(16).startswith(b"HTTP/1.1 503")
    third = loop.slot_of(("", served[2].fileno()))
    assert third is not None and not third.reserved
    third.in_flight = 1  # mid-request: not evictable either
    await admit(served[3])
    fourth = loop.slot_of(("", served[3].fileno()))
    assert fourth is not None and fourth.reserved
    await admit(served[4])  # general and reserved slots all taken, nobody evictable
    assert loop.refused == 1
    for _, client in pairs:
        client.close()
    with anyio.fail_after(10):
        while loop.active:
            await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

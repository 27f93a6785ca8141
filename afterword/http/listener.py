"""Our own accept loop in front of hypercorn's HTTP/1.1 protocol.

hypercorn's ``serve`` accepts every connection it is offered and keeps each until the peer
goes away, so a few hundred slow clients hold the server's memory and descriptors, and when
descriptors run out every failed ``accept`` is logged. This module keeps hypercorn's protocol
code (h11 parsing, the ASGI bridge) and replaces only the loop around it:

1. at most ``max_connections`` connections are served at once; one more is answered with a
   ``503`` JSON error and closed, so memory is bounded by the cap times the per-connection
   bound (request head 16 KiB, read buffer 64 KiB, body limit);
2. a failing ``accept`` (out of descriptors, say) is logged once when the failures begin and
   once when they end, with the count, and retried after a pause, never in a tight loop;
3. a request hypercorn cannot parse (bad Content-Length, control characters, an oversized
   head) is answered with the JSON error envelope instead of an empty body.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import msgspec
from hypercorn.asyncio.lifespan import Lifespan
from hypercorn.asyncio.task_group import TaskGroup
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import RawData
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.typing import AppWrapper, ConnectionState, H11SendableEvent
from hypercorn.utils import parse_socket_addr, wrap_app

from ..protocol.wire import ErrorBody, ErrorDetail

log = logging.getLogger("afterword.http")

RESERVED_DESCRIPTORS = 64
"""Descriptors kept free, beyond those already open and the refusals in flight, for the
store, WAL segments, blobs and outbound channels, when the cap is clamped to the limit."""
MAX_REFUSALS_IN_FLIGHT = 32
REFUSAL_LINGER_S = 1.0
ACCEPT_RETRY_S = 0.1
ACCEPT_LOG_INTERVAL_S = 60.0

_PROTOCOL_ERRORS = {
    400: ("invalid_request", "malformed HTTP request"),
    413: ("too_large", "request too large"),
    414: ("too_large", "request target too long"),
    431: ("too_large", "request head (line or headers) too large"),
    501: ("invalid_request", "unsupported transfer encoding"),
}
_encoder = msgspec.json.Encoder()


def error_bytes(status: int, code: str, message: str) -> bytes:
    return _encoder.encode(ErrorBody(error=ErrorDetail(code=code, message=message)))


def _refusal() -> bytes:
    body = error_bytes(503, "too_many_connections", "the service is serving its maximum number of connections")
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


REFUSAL = _refusal()


def open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: assume a modest process
        return 64


def connection_cap(configured: int) -> int:
    """``configured``, lowered if the descriptor limit could not hold that many connections
    besides the descriptors already open, the refusals in flight and a reserve."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    room = soft - open_descriptors() - MAX_REFUSALS_IN_FLIGHT - RESERVED_DESCRIPTORS
    return max(1, min(configured, room))


def no_delay(conn: socket.socket) -> None:
    """Turn Nagle's algorithm off on an accepted TCP connection.

    asyncio does this itself only for sockets whose ``proto`` is ``IPPROTO_TCP``; a socket
    accepted from a listener made with ``socket.socket(family, SOCK_STREAM)`` reports 0, so
    it was skipped. h11 writes a response's head and body separately; with Nagle on, the body
    waited for the peer's delayed ACK (~40 ms on Linux) on every keep-alive request."""
    if conn.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _JsonErrorH11(H11Protocol):
    """hypercorn's HTTP/1.1 protocol, answering unparseable requests with the JSON envelope,
    and writing a response's head together with its first body bytes.

    h11 serialises the head and each body part separately and hypercorn writes each at once:
    two ``send`` calls (and, with Nagle off, two packets) for every small JSON answer. The
    head of a final response is held until the next event on this connection (its body, or
    its end when it has none) and goes out in the same write."""

    _held_head = b""

    async def _send_h11_event(self, event: H11SendableEvent) -> None:
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError:
            if self.connection.their_state != h11.ERROR:
                raise
            return
        if isinstance(event, h11.Response):
            self._held_head += data or b""
            return
        if self._held_head:
            data, self._held_head = self._held_head + (data or b""), b""
        await self.send(RawData(data=data))

    async def _send_error_response(self, status_code: int) -> None:
        code, message = _PROTOCOL_ERRORS.get(status_code, ("invalid_request", "malformed HTTP request"))
        body = error_bytes(status_code, code, message)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


class _Protocol(ProtocolWrapper):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        (app, config, context, task_group, state, ssl, client, server, send) = args[:9]
        self.protocol = _JsonErrorH11(app, config, context, task_group, state, ssl, client, server, send)


class _Connection(TCPServer):
    """hypercorn's per-connection driver with our protocol class (plain HTTP only)."""

    async def run(self) -> None:
        sock = self.writer.get_extra_info("socket")
        try:
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
            async with TaskGroup(self.loop) as task_group:
                self._task_group = task_group
                self.protocol = _Protocol(
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                )
                await self.protocol.initiate()
                await self.idle_task.restart(task_group, self._idle_timeout)
                await self._read_data()
                # The peer is gone: hypercorn would keep the idle timer (and with it this
                # connection's descriptor and buffers) alive for the whole keep-alive timeout.
                await self.idle_task.stop()
        except OSError:
            pass
        finally:
            await self._close()


class AcceptLoop:
    """Accepts until cancelled; hands each connection to ``handle`` or refuses it.

    ``accept`` is injected so the failure path can be driven by a test."""

    def __init__(
        self,
        accept: Callable[[], Awaitable[socket.socket]],
        handle: Callable[[socket.socket], Awaitable[None]],
        max_connections: int,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._accept = accept
        self._handle = handle
        self.max_connections = max_connections
        self._sleep = sleep
        self.active = 0
        self.refused = 0
        self.accept_failures = 0
        self._refusing = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<AcceptLoop active={self.active}/{self.max_connections} refused={self.refused}>"

    async def run(self) -> None:
        unlogged = 0
        logged_at: float | None = None
        while True:
            try:
                conn = await self._accept()
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR):
                    continue
                # Out of descriptors (say) fails every attempt until something closes: one
                # line when it starts, then at most one a minute with the count meanwhile.
                self.accept_failures += 1
                unlogged += 1
                now = time.monotonic()
                if logged_at is None or now - logged_at >= ACCEPT_LOG_INTERVAL_S:
                    log.warning(
                        "cannot accept connections: %s (%d failed attempts since the last message; "
                        "retrying every %.1f s)",
                        exc.strerror or type(exc).__name__,
                        unlogged,
                        ACCEPT_RETRY_S,
                    )
                    logged_at, unlogged = now, 0
                await self._sleep(ACCEPT_RETRY_S)
                continue
            if self.active >= self.max_connections:
                self.refused += 1
                self._refuse(conn)
            else:
                self.active += 1
                self._spawn(self._serve(conn))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await self._handle(conn)
        finally:
            self.active -= 1
            conn.close()

    def _refuse(self, conn: socket.socket) -> None:
        """Say why in one write (synchronously: an accept that completes at once never
        yields, so a task would let refused sockets pile up), then linger briefly reading
        and dropping what the client already sent, so closing does not reset the connection
        before it reads the answer. At most ``MAX_REFUSALS_IN_FLIGHT`` linger."""
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            conn.send(REFUSAL)
            conn.shutdown(socket.SHUT_WR)
        if self._refusing >= MAX_REFUSALS_IN_FLIGHT:
            conn.close()
            return
        self._refusing += 1
        self._spawn(self._linger(conn))

    async def _linger(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(REFUSAL_LINGER_S):
                    drained = 0
                    while drained < 65536:
                        data = await loop.sock_recv(conn, 4096)
                        if not data:
                            break
                        drained += len(data)
        finally:
            self._refusing -= 1
            conn.close()

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` for connections in progress, then cancel the rest."""
        tasks = list(self._tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)


async def serve_socket(
    app: object,
    config: HypercornConfig,
    sock: socket.socket,
    *,
    max_connections: int,
    shutdown_trigger: Callable[[], Awaitable[object]],
    on_start: Callable[[AcceptLoop], None] | None = None,
) -> None:
    """Serve ``app`` (ASGI) on the listening ``sock`` until ``shutdown_trigger`` returns."""
    loop = asyncio.get_running_loop()
    wrapped: AppWrapper = wrap_app(app, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, loop, state)
    lifespan_task = loop.create_task(lifespan.handle_lifespan())
    await lifespan.wait_for_startup()
    context = WorkerContext(None)
    sock.setblocking(False)

    async def accept() -> socket.socket:
        conn, _ = await loop.sock_accept(sock)
        no_delay(conn)
        return conn

    async def handle(conn: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=conn)
        await _Connection(wrapped, loop, config, context, state, reader, writer)

    acceptor = AcceptLoop(accept, handle, max_connections)
    if on_start is not None:
        on_start(acceptor)
    accept_task = loop.create_task(acceptor.run())
    try:
        await shutdown_trigger()
    finally:
        accept_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accept_task
        await context.terminated.set()
        await acceptor.drain(config.graceful_timeout)
        await lifespan.wait_for_shutdown()
        lifespan_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lifespan_task

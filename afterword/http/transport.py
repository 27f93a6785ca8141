"""The one module that reaches into hypercorn: our accept loop around its HTTP/1.1 protocol.

hypercorn's public ``serve`` accepts every connection, keeps each until the peer goes away and
speaks cleartext HTTP/2 to any client that asks (prior knowledge or ``Upgrade: h2c``), where
each of 100 streams per connection gets its own body allowance. What hypercorn's settings
(``hypercorn_config`` in ``server.py``) and the ASGI middleware (``gate.py``) cannot do needs
the connection: our accept loop (``acceptor.py``, plain asyncio) admits connections, and this
module runs hypercorn's HTTP/1.1 protocol on each, against the exact hypercorn version pinned
in pyproject.toml; ``tests/service/test_http_transport_pin.py`` fails on an upgrade that changes any
internal used below. Together they keep these rules:

1. connections are admitted to ``max_connections`` general slots; when those are full, one
   that proved nothing and is between requests is evicted for the newcomer, else the newcomer
   takes one of ``RESERVED_SLOTS`` slots kept for the operator and the liveness probe (as
   PostgreSQL keeps connections for superusers); past those it is answered ``503`` and closed;
2. a connection without a credentialed request after ``UNCREDENTIALED_GRACE_S`` is closed;
3. only HTTP/1.1 is spoken (``_Http11`` ignores ``Upgrade: h2c`` and never switches to h2);
4. a request h11 cannot parse is answered with the JSON error envelope;
5. a failing ``accept`` (out of descriptors, say) is logged once when the failures begin and
   then at most once a minute, and retried after a pause, never in a tight loop.

Touched internals: ``H11Protocol`` (constructor, ``_check_protocol``, ``_send_error_response``,
``_send_h11_event``), ``TCPServer`` (constructor, ``_read_data``, ``_close``, ``idle_task``,
``_idle_timeout``, ``protocol_send``), ``TaskGroup``, ``Lifespan``, ``WorkerContext``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import h11
from hypercorn.asyncio.lifespan import Lifespan
from hypercorn.asyncio.task_group import TaskGroup
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config as HypercornConfig
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.typing import AppWrapper, ConnectionState
from hypercorn.utils import parse_socket_addr, wrap_app

from ..protocol.wire import ErrorBody, ErrorDetail
from .acceptor import AcceptLoop, no_delay
from .wirebody import encoder

_PROTOCOL_ERRORS = {
    400: ("invalid_request", "malformed HTTP request"),
    413: ("too_large", "request too large"),
    414: ("too_large", "request target too long"),
    431: ("too_large", "request head (line or headers) too large"),
    501: ("invalid_request", "unsupported transfer encoding"),
}


def error_bytes(code: str, message: str) -> bytes:
    return encoder.encode(ErrorBody(error=ErrorDetail(code=code, message=message)))


class _Http11(H11Protocol):
    """hypercorn's HTTP/1.1 protocol, speaking only HTTP/1.1 and answering unparseable
    requests with the JSON envelope."""

    async def _check_protocol(self, event: h11.Request) -> None:
        # hypercorn switches to HTTP/2 here on ``Upgrade: h2c`` or the h2 preface. Doing
        # nothing answers the upgrade request in HTTP/1.1 (an upgrade is optional for the
        # server), and the preface ``PRI * HTTP/2.0`` becomes a request the app refuses (400).
        return None

    async def _send_error_response(self, status_code: int) -> None:
        code, message = _PROTOCOL_ERRORS.get(status_code, ("invalid_request", "malformed HTTP request"))
        body = error_bytes(code, message)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


class _Connection(TCPServer):
    """hypercorn's per-connection driver, with ``_Http11`` in place of its protocol switcher
    (plain HTTP/1.1 only)."""

    async def run(self) -> None:
        sock = self.writer.get_extra_info("socket")
        try:
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
            async with TaskGroup(self.loop) as task_group:
                self._task_group = task_group
                self.protocol = _Http11(  # type: ignore[assignment]
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


async def serve_socket(
    app: object,
    config: HypercornConfig,
    sock: socket.socket,
    acceptor: Callable[
        [Callable[[], Awaitable[socket.socket]], Callable[[socket.socket], Awaitable[None]]], AcceptLoop
    ],
    *,
    shutdown_trigger: Callable[[], Awaitable[object]],
) -> None:
    """Serve ``app`` (ASGI) on the listening ``sock`` until ``shutdown_trigger`` returns;
    ``acceptor(accept, handle)`` makes the accept loop."""
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

    loop_ = acceptor(accept, handle)
    accept_task = loop.create_task(loop_.run())
    try:
        await shutdown_trigger()
    finally:
        accept_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accept_task
        await context.terminated.set()
        await loop_.drain(config.graceful_timeout)
        await lifespan.wait_for_shutdown()
        lifespan_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lifespan_task

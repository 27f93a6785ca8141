"""Serving the Quart app on a pre-bound loopback socket (hypercorn's HTTP/1.1 protocol).

Binding the socket ourselves means the port is listening before ``serve`` returns control,
and a port already in use fails at once with a clear error instead of inside a background
task. Every route goes through one application: the Quart app behind the connection gate.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import TaskGroup
from hypercorn.config import Config as HypercornConfig

from ..app.service import ContinuationService
from ..config.mcp import is_loopback_host
from ..errors import AfterwordError
from .acceptor import AcceptLoop, connection_cap
from .app import MAX_REQUEST_HEAD, create_app
from .gate import ConnectionGate, Peer, Slot
from .transport import serve_socket

log = logging.getLogger("afterword.http")


class ServeError(AfterwordError):
    """The HTTP facade could not start (port in use, non-loopback host)."""


def _bind(host: str, port: int) -> socket.socket:
    if not is_loopback_host(host):
        raise ServeError(f"refusing to serve on non-loopback host {host}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    addr = "127.0.0.1" if host == "localhost" else host
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port))
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(512)
    sock.set_inheritable(True)
    return sock


def hypercorn_config() -> HypercornConfig:
    """hypercorn's settings (those that apply to the protocol it runs on our socket)."""
    hc = HypercornConfig()
    hc.accesslog = None
    hc.errorlog = logging.getLogger("afterword.hypercorn")
    hc.graceful_timeout = 5.0
    hc.keep_alive_timeout = 30.0
    # Bounded per connection: the request head, and how much hypercorn queues for the app.
    hc.h11_max_incomplete_size = MAX_REQUEST_HEAD
    hc.max_app_queue_size = 10
    return hc


class HttpServer:
    def __init__(self, service: ContinuationService) -> None:
        self.service = service
        self._stop = anyio.Event()
        self._done = anyio.Event()
        self._sock: socket.socket | None = None
        self.acceptor: AcceptLoop | None = None
        """The accept loop while serving (its counters are the connection statistics)."""

    def bind(self) -> None:
        """Listen on the configured loopback port now (raises ``ServeError`` at once)."""
        if self._sock is None:
            cfg = self.service.config
            self._sock = _bind(cfg.host, cfg.port)

    def unbind(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            # hypercorn may already have closed the descriptor it was handed
            with contextlib.suppress(OSError):
                sock.close()

    async def start(self, tg: TaskGroup) -> None:
        self.bind()
        assert self._sock is not None
        hc = hypercorn_config()
        app = ConnectionGate(create_app(self.service), self._slot_of)  # type: ignore[arg-type]
        tg.start_soon(self._run, app, hc)
        log.info("serving on %s", self.service.base_url)

    async def _run(self, app: object, hc: HypercornConfig) -> None:
        try:
            assert self._sock is not None
            cap = connection_cap(self.service.config.limits.max_connections)
            if cap < self.service.config.limits.max_connections:
                log.warning("serving at most %d connections (the descriptor limit allows no more)", cap)

            def acceptor(
                accept: Callable[[], Awaitable[socket.socket]],
                handle: Callable[[socket.socket], Awaitable[None]],
            ) -> AcceptLoop:
                self.acceptor = AcceptLoop(accept, handle, cap)
                return self.acceptor

            await serve_socket(app, hc, self._sock, acceptor, shutdown_trigger=self._stop.wait)
        finally:
            self.unbind()
            self._done.set()

    def _slot_of(self, peer: Peer) -> Slot | None:
        return self.acceptor.slot_of(peer) if self.acceptor is not None else None

    async def stop(self) -> None:
        self._stop.set()
        with anyio.move_on_after(10):
            await self._done.wait()

"""Serving the app with hypercorn on a pre-bound loopback socket.

Binding the socket ourselves (and passing it to hypercorn as ``fd://``) means the port is
listening before ``serve`` returns control, and a port already in use fails at once with a
clear error instead of inside a background task.
"""

from __future__ import annotations

import contextlib
import logging
import socket

import anyio
from anyio.abc import TaskGroup
from hypercorn.config import Config as HypercornConfig

from ..app.service import ContinuationService
from ..config.mcp import is_loopback_host
from ..errors import AfterwordError
from .app import MAX_REQUEST_HEAD
from .fastpath import DEFAULT_ON, create_asgi_app, switch_on
from .listener import AcceptLoop, connection_cap, serve_socket

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


def hypercorn_config(sock: socket.socket) -> HypercornConfig:
    """hypercorn's settings for serving on the bound ``sock``."""
    hc = HypercornConfig()
    hc.bind = [f"fd://{sock.fileno()}"]
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
        self._fastpath = DEFAULT_ON
        self.acceptor: AcceptLoop | None = None
        """The accept loop while serving (its counters are the connection statistics)."""

    def bind(self) -> None:
        """Listen on the configured loopback port now (raises ``ServeError`` at once)."""
        if self._sock is None:
            try:  # read here, outside any task group, so a bad value is a plain ServeError
                self._fastpath = switch_on()
            except ValueError as exc:
                raise ServeError(str(exc)) from None
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
        hc = hypercorn_config(self._sock)
        app = create_asgi_app(self.service, fastpath=self._fastpath)
        tg.start_soon(self._run, app, hc)
        log.info("serving on %s", self.service.base_url)

    async def _run(self, app: object, hc: HypercornConfig) -> None:
        try:
            assert self._sock is not None
            cap = connection_cap(self.service.config.limits.max_connections)
            if cap < self.service.config.limits.max_connections:
                log.warning("serving at most %d connections (the descriptor limit allows no more)", cap)

            def started(acceptor: AcceptLoop) -> None:
                self.acceptor = acceptor

            await serve_socket(
                app, hc, self._sock, max_connections=cap, shutdown_trigger=self._stop.wait, on_start=started
            )
        finally:
            self.unbind()
            self._done.set()

    async def stop(self) -> None:
        self._stop.set()
        with anyio.move_on_after(10):
            await self._done.wait()

"""The accept loop: connection slots, eviction, the proof timer, refusals, accept failures.

Plain asyncio over accepted sockets; ``transport.py`` hands each admitted connection to
hypercorn's HTTP/1.1 protocol, and ``gate.py`` (ASGI middleware) keeps each slot's standing.
docs/http-hardening.md ("Slow and numerous clients") states the rules.
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

from .gate import REFUSAL_BODY, Peer, Slot

log = logging.getLogger("afterword.http")

RESERVED_SLOTS = 4
"""Connections kept, beyond ``maxConnections``, for the operator and the liveness probe."""
UNCREDENTIALED_GRACE_S = 10.0
"""How long a connection may stay without a request that carried an accepted credential."""
RESERVED_DESCRIPTORS = 64
"""Descriptors kept free, beyond those already open and the refusals in flight, for the
store, WAL segments, blobs and outbound channels, when the cap is clamped to the limit."""
MAX_REFUSALS_IN_FLIGHT = 32
REFUSAL_LINGER_S = 1.0
ACCEPT_RETRY_S = 0.1
ACCEPT_LOG_INTERVAL_S = 60.0

REFUSAL = (
    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    f"content-length: {len(REFUSAL_BODY)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
).encode() + REFUSAL_BODY


def open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: assume a modest process
        return 64


def connection_cap(configured: int) -> int:
    """``configured``, lowered if the descriptor limit could not hold that many connections
    (and the reserved slots) besides the descriptors already open, the refusals in flight and
    a reserve."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    room = soft - open_descriptors() - MAX_REFUSALS_IN_FLIGHT - RESERVED_DESCRIPTORS - RESERVED_SLOTS
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


def _peer(conn: socket.socket) -> Peer | None:
    try:
        addr = conn.getpeername()
    except OSError:
        return None
    if isinstance(addr, tuple):
        return (str(addr[0]), int(addr[1]))
    return ("", conn.fileno())  # not TCP (a test's socketpair): still one key per connection


class AcceptLoop:
    """Accepts until cancelled; gives each connection a slot (general, by eviction, or
    reserved) and hands it to ``handle``, or refuses it.

    ``accept`` is injected so the failure path can be driven by a test."""

    def __init__(
        self,
        accept: Callable[[], Awaitable[socket.socket]],
        handle: Callable[[socket.socket], Awaitable[None]],
        max_connections: int,
        *,
        reserved: int = RESERVED_SLOTS,
        grace_s: float | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._accept = accept
        self._handle = handle
        self.max_connections = max_connections
        self.reserved = reserved
        self.grace_s = UNCREDENTIALED_GRACE_S if grace_s is None else grace_s
        self._sleep = sleep
        self.refused = 0
        self.evicted = 0
        self.accept_failures = 0
        self._refusing = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._conns: dict[Peer, tuple[socket.socket, Slot]] = {}
        self._general = 0
        self._reserved_held = 0

    def __repr__(self) -> str:
        return (
            f"<AcceptLoop active={self.active}/{self.max_connections}+{self.reserved} refused={self.refused}>"
        )

    @property
    def active(self) -> int:
        return self._general + self._reserved_held

    def slot_of(self, peer: Peer) -> Slot | None:
        entry = self._conns.get(peer)
        return entry[1] if entry is not None else None

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
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        peer = _peer(conn)
        if peer is None:
            conn.close()
            return
        if self._general < self.max_connections or self._evict_one():
            reserved = False
        elif self._reserved_held < self.reserved:
            reserved = True
        else:
            self.refused += 1
            self._refuse(conn)
            return
        slot = Slot(reserved=reserved, opened=time.monotonic())
        if reserved:
            self._reserved_held += 1
        else:
            self._general += 1
        self._conns[peer] = (conn, slot)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.grace_s, self._expire, conn, slot)
        self._spawn(self._serve(conn, peer, slot, timer))

    def _evict_one(self) -> bool:
        """Close the oldest general connection that proved nothing and is between requests;
        its slot is counted free at once (its task ends shortly)."""
        if self._refusing >= MAX_REFUSALS_IN_FLIGHT:
            return False  # its descriptor is not free until it closes: count it as a refusal
        candidates = [
            (slot.opened, peer)
            for peer, (_, slot) in self._conns.items()
            if not slot.reserved and slot.evictable
        ]
        if not candidates:
            return False
        _, peer = min(candidates)
        conn, slot = self._conns.pop(peer)
        self._general -= 1  # its task, ending shortly, finds it gone and counts nothing
        slot.evicted = True
        self._refusing += 1
        self.evicted += 1
        self._cut(conn, REFUSAL)
        return True

    @staticmethod
    def _cut(conn: socket.socket, farewell: bytes = b"") -> None:
        """End a served connection from outside hypercorn: its reader sees end of file and
        hypercorn closes the connection the usual way."""
        with contextlib.suppress(OSError):
            if farewell:
                conn.send(farewell)
            conn.shutdown(socket.SHUT_RDWR)

    def _expire(self, conn: socket.socket, slot: Slot) -> None:
        if slot.credentialed:
            return
        slot.expired = True
        if slot.in_flight == 0:
            self._cut(conn)
        # else the gate closes it after the answer in progress

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket, peer: Peer, slot: Slot, timer: asyncio.TimerHandle) -> None:
        try:
            await self._handle(conn)
        finally:
            timer.cancel()
            # Counted by the slot's own standing, not by the table: a new connection from the
            # same address and port may already have replaced this one's entry.
            if slot.evicted:
                self._refusing -= 1
            elif slot.reserved:
                self._reserved_held -= 1
            else:
                self._general -= 1
            entry = self._conns.get(peer)
            if entry is not None and entry[1] is slot:
                del self._conns[peer]
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

"""Connection slots and the ASGI middleware that tells the transport who holds them.

The transport (``transport.py``) counts connections; only the application can tell a caller
with a credential from a stranger. This middleware, in front of the Quart app, marks a
connection *credentialed* once one of its requests carried a bearer credential that a route
accepted, and closes (``Connection: close``) what must not stay:

- a connection admitted to one of the *reserved* slots (the general ones were full) may only
  ask the operator routes and the liveness probe, and is closed after each answer unless it
  proved an operator credential; anything else there is refused with ``503``;
- a connection past its grace period without a credentialed request is closed after the
  answer it is waiting for (an idle one is closed by the transport's timer).

It reads only the ASGI scope (``client``, ``path``, headers) and the response status, so it
depends on no server internals. Slots are found by the peer address, which is unique among
live connections on one listener.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..protocol import paths
from ..protocol.wire import ErrorBody, ErrorDetail
from .wirebody import encoder

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Peer = tuple[str, int]

PUBLIC_PATHS = frozenset({paths.LIVEZ, paths.OPENAPI})
"""Routes that answer without a credential: a request there proves nothing."""
PROBE_PATHS = frozenset({paths.LIVEZ})
ACCEPTED_ERRORS = frozenset({409, 413})
"""Error statuses a route answers only after it accepted the credential (the state or the
body was wrong, not the caller)."""

REFUSAL_BODY = encoder.encode(
    ErrorBody(
        error=ErrorDetail(
            code="too_many_connections", message="the service is serving its maximum number of connections"
        )
    )
)


class Slot:
    """One served connection's standing."""

    __slots__ = ("credentialed", "evicted", "expired", "in_flight", "opened", "reserved")

    def __init__(self, *, reserved: bool, opened: float) -> None:
        self.reserved = reserved
        self.opened = opened
        self.credentialed = False
        self.expired = False
        self.evicted = False
        self.in_flight = 0

    @property
    def evictable(self) -> bool:
        """A connection that proved nothing and is between requests."""
        return not self.credentialed and self.in_flight == 0


def credential_accepted(path: str, headers: list[tuple[bytes, bytes]], status: int) -> bool:
    if path in PUBLIC_PATHS or not any(name.lower() == b"authorization" for name, _ in headers):
        return False
    return status < 400 or status in ACCEPTED_ERRORS


def reserved_may_ask(path: str) -> bool:
    return path in PROBE_PATHS or path.startswith(paths.OPERATOR_PREFIX)


class ConnectionGate:
    """ASGI middleware: see the module docstring. ``slot_of`` finds the slot of a peer (or
    None when the app is served without the transport, as in tests)."""

    def __init__(self, app: ASGIApp, slot_of: Callable[[Peer], Slot | None]) -> None:
        self.app = app
        self._slot_of = slot_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        slot = self._slot_of((str(client[0]), int(client[1]))) if scope["type"] == "http" and client else None
        if slot is None:
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if slot.reserved and not reserved_may_ask(path):
            await _refuse(send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or ())

        async def gated_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                if credential_accepted(path, headers, int(message["status"])):
                    slot.credentialed = True
                if not slot.credentialed and (slot.reserved or slot.expired):
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        slot.in_flight += 1
        try:
            await self.app(scope, receive, gated_send)
        finally:
            slot.in_flight -= 1


async def _refuse(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(REFUSAL_BODY)).encode()),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": REFUSAL_BODY})

"""A raw ASGI front door for the hot producer routes, with the Quart app behind it.

Claim, detached claim, result and status are the requests a producer sends per continuation.
For each, Quart builds request and context objects, runs two tasks and its routing, hook and
header machinery: about 14-20% of ``serve``'s busy loop in profiles. :class:`FastPath` answers exactly these requests directly, calling the same functions the
Quart routes call (``producer.py``) and the same error answers (``wirebody.py``), and hands
everything else to Quart untouched.

"Exactly these" is narrow on purpose. A request is answered here only when it is HTTP/1.1,
its path is one of the four routes spelled canonically (no percent-escape, no doubled or
trailing slash, no root path), its method is the route's, its Host names this service, its
head is within the head limit, and its framing headers are plain (one Content-Length or
``Transfer-Encoding: chunked``, no ``Expect``). Anything else is Quart's, so the unusual
cases keep Quart's answers without this module having to know them. The choice is made from
the request head alone, before any body byte is read, so a request handed on is untouched.

The one behaviour that differs: Quart cancels a handler when the client disconnects after
sending its whole body; here the handler runs to completion (its answer goes nowhere). Every
hot route is safe to finish (the same request retried is idempotent), and a durable write
that completes is simpler to reason about than one cancelled part way.

``AFTERWORD_HTTP_FASTPATH`` (``1`` or ``0``) switches it on or off when ``serve`` assembles
the app; see docs/performance.md for what it buys.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from ..continuations.errors import ContinuationError
from ..disk import DiskError
from ..errors import AfterwordError
from ..protocol import paths
from ..protocol.headers import SERVICE_NAME_HEADER
from . import producer
from .app import MAX_CONTENT_LENGTH, MAX_REQUEST_HEAD, allowed_hosts, create_app, request_head_size
from .wirebody import (
    ErrorAnswer,
    check_declared_length,
    check_read_length,
    domain_error,
    encoder,
    http_error,
    storage_error,
    unexpected_error,
)

if TYPE_CHECKING:
    from ..app.service import ContinuationService

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ENV_SWITCH = "AFTERWORD_HTTP_FASTPATH"
DEFAULT_ON = True

_CLAIM, _DETACHED, _RESULT, _STATUS = "claim", "detached", "result", "status"
_PREFIX = paths.STATUS.removesuffix("{cid}")
_RESULT_SUFFIX = paths.RESULT.removeprefix(paths.STATUS)
# Ids that are also a static segment under the prefix: Quart's router decides those.
_RESERVED_IDS = frozenset({"claim", "detached"})
# The rule Quart would name in a log line for each route.
_RULES = {
    _CLAIM: paths.CLAIM,
    _DETACHED: paths.DETACHED_CLAIM,
    _RESULT: paths.route(paths.RESULT),
    _STATUS: paths.route(paths.STATUS),
}
# Headers a route reads, by their lowercase wire name; the first of each counts (as Quart's
# ``headers.get`` does).
_WANTED = {
    b"host": "host",
    b"authorization": "authorization",
    b"content-type": "content-type",
    SERVICE_NAME_HEADER.lower().encode(): SERVICE_NAME_HEADER.lower(),
}
_JSON_HEADER = (b"content-type", b"application/json")


class _Disconnected(AfterwordError):
    """The client went away before its body arrived: nothing is answered."""


def switch_on(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether the fast path is on: ``AFTERWORD_HTTP_FASTPATH`` = 1/0, else the default."""
    value = (os.environ if environ is None else environ).get(ENV_SWITCH, "").strip()
    if value in ("0", "1"):
        return value == "1"
    if value:
        raise ValueError(f"{ENV_SWITCH} must be 0 or 1, not {value!r}")
    return DEFAULT_ON


def match(method: str, path: str) -> tuple[str, str] | None:
    """The hot route and continuation id of a canonical ``method path``, or None."""
    if method == "POST":
        if path == paths.CLAIM:
            return _CLAIM, ""
        if path == paths.DETACHED_CLAIM:
            return _DETACHED, ""
    if not path.startswith(_PREFIX):
        return None
    rest = path[len(_PREFIX) :]
    if method in ("PUT", "POST") and rest.endswith(_RESULT_SUFFIX):
        cid = rest[: -len(_RESULT_SUFFIX)]
        route = _RESULT
    elif method == "GET":
        cid, route = rest, _STATUS
    else:
        return None
    if not cid or "/" in cid or cid in _RESERVED_IDS:
        return None
    return route, cid


class _Request:
    """One fast-path request as ``producer.Incoming``: its head already read from the scope."""

    __slots__ = ("_headers", "_length", "_receive", "_timeout")

    def __init__(self, headers: dict[str, str], length: int | None, receive: Receive, timeout: float) -> None:
        self._headers = headers
        self._length = length
        self._receive = receive
        self._timeout = timeout

    def header(self, name: str) -> str:
        return self._headers.get(name.lower(), "")

    async def body(self, limit: int) -> bytes:
        check_declared_length(self._length, limit)
        try:
            async with asyncio.timeout(self._timeout):
                data = await self._read()
        except TimeoutError:
            raise RequestTimeout() from None
        return check_read_length(data, limit)

    async def _read(self) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            if message["type"] != "http.request":
                continue
            chunk = message.get("body", b"")
            if chunk:
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_CONTENT_LENGTH:  # Quart's app-wide cap, with its answer
                    raise RequestEntityTooLarge()
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class FastPath:
    """ASGI app: the hot producer routes answered here, every other request by ``fallback``."""

    def __init__(self, service: ContinuationService, fallback: ASGIApp) -> None:
        self.service = service
        self.fallback = fallback
        self.hosts = allowed_hosts(service.config.host, service.config.port)
        self.body_timeout_s = service.config.limits.body_timeout_ms / 1000
        self.answered = 0
        """Requests this path answered itself (the rest went to ``fallback``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = match(scope["method"], scope["path"])
            if found is not None:
                req = self._plain(scope, receive)
                if req is not None:
                    await self._answer(found[0], found[1], scope["method"], req, send)
                    return
        await self.fallback(scope, receive, send)

    def _plain(self, scope: Scope, receive: Receive) -> _Request | None:
        """The request, if nothing in its head needs Quart's judgement; else None."""
        if scope.get("http_version") != "1.1" or scope.get("root_path"):
            return None
        path: str = scope["path"]
        if not path.isascii() or scope.get("raw_path") != path.encode():
            return None  # percent-escapes: Quart's router sees the decoded path
        if request_head_size(scope) > MAX_REQUEST_HEAD:
            return None
        headers: dict[str, str] = {}
        length: int | None = None
        chunked = False
        for raw_name, raw_value in scope["headers"]:
            name = _WANTED.get(raw_name)
            if name is not None:
                if name not in headers:
                    headers[name] = raw_value.decode("latin1")
            elif raw_name == b"content-length":
                if length is not None or not raw_value.isdigit():
                    return None
                length = int(raw_value)
            elif raw_name == b"transfer-encoding":
                if raw_value.lower() != b"chunked" or chunked:
                    return None
                chunked = True
            elif raw_name == b"expect":
                return None
        if chunked:
            length = None  # werkzeug ignores the length of a chunked body, as h11 does
        if headers.get("host", "").strip().lower() not in self.hosts:
            return None
        return _Request(headers, length, receive, self.body_timeout_s)

    async def _answer(self, route: str, cid: str, method: str, req: _Request, send: Send) -> None:
        service = self.service
        error: ErrorAnswer
        try:
            if route == _STATUS:
                body: object = producer.status(service, req, cid)
            elif route == _RESULT:
                body = await producer.result(service, req, cid)
            elif route == _DETACHED:
                body = await producer.detached_claim(service, req)
            else:
                body = await producer.claim(service, req)
        except _Disconnected:
            return
        except ContinuationError as exc:
            error = domain_error(exc)
        except DiskError as exc:  # as Quart's handler: the first failure (UnsafeStateError) too
            error = storage_error(exc, service, method)
        except HTTPException as exc:
            error = http_error(exc)
        except Exception as exc:
            error = unexpected_error(exc, method, _RULES[route])
        else:
            self.answered += 1
            await _send(send, 200, encoder.encode(body), ())
            return
        self.answered += 1
        await _send(send, error.status, error.body, error.headers)


async def _send(send: Send, status: int, body: bytes, extra: tuple[tuple[str, str], ...]) -> None:
    # The headers Quart sends for the same answer, in its order: content type, length, extras.
    headers = [_JSON_HEADER, (b"content-length", str(len(body)).encode())]
    headers.extend((name.lower().encode(), value.encode()) for name, value in extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def create_asgi_app(service: ContinuationService, *, fastpath: bool | None = None) -> ASGIApp:
    """The ASGI app ``serve`` runs: Quart, behind the fast path unless it is switched off."""
    app = create_app(service)
    if fastpath is None:
        fastpath = switch_on()
    if not fastpath:
        return app  # type: ignore[return-value]
    return FastPath(service, app)  # type: ignore[arg-type]

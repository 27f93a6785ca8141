"""Producer helper for the authors of trusted MCP servers.

A selected MCP server receives a claim capability from its host: in its environment when it
runs over stdio, or in the headers of each request when it is a loopback streamable-HTTP
server. During the tool call that accepts asynchronous work, the server claims a
continuation; later, when the work is done, it submits one immutable result::

    capability = ClaimCapability.from_env()          # or .from_headers(request.headers)
    async with Producer() as producer:
        handle = await producer.claim(capability, task_key=key, task_hash=digest, deadline=when)
        ...                                           # reply "accepted" to the tool call
        await handle.submit_result({"summary": "done"}, idempotency_key=key)

Every call the service treats as idempotent (claim with the same task, result with the same
key and payload, status) is retried on network errors and 5xx answers with a bounded,
jittered exponential backoff. Refusals are typed (:class:`ClaimConflict`, :class:`CapabilityClosed`,
:class:`NotAuthorized`, ...), never retried, and never carry a token: tokens live only in
fields hidden from ``repr`` and are not logged.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Self
from urllib.parse import urlsplit

import anyio
import httpx
import msgspec

from ..config.mcp import is_loopback_url
from ..continuations.rules import payload_hash
from ..errors import AfterwordError, CallerError, RemoteError
from ..host.binding import RESERVED_ENV, RESERVED_HEADERS
from ..protocol import paths
from ..protocol.wire import ClaimResponse, StatusBody

__all__ = [
    "AdmissionLimited",
    "CapabilityClosed",
    "ClaimCapability",
    "ClaimConflict",
    "ClaimHandle",
    "Forbidden",
    "InvalidCapability",
    "InvalidRequest",
    "NoCapability",
    "NotAuthorized",
    "NotFound",
    "Producer",
    "ProducerError",
    "RejectedByService",
    "RetryPolicy",
    "ServiceUnavailable",
    "TooLarge",
    "format_deadline",
    "payload_hash",
    "task_hash",
]

log = logging.getLogger("afterword.producer")

SERVICE_NAME_HEADER = "X-Mono-Agent-Service-Name"
_claim_decoder = msgspec.json.Decoder(ClaimResponse)
_status_decoder = msgspec.json.Decoder(StatusBody)


# -- errors -------------------------------------------------------------------------------------
class ProducerError(AfterwordError):
    """Base of every error raised by this module. Messages never contain a token."""


class NoCapability(ProducerError, CallerError):
    """This server was not handed a claim capability: it is not selected in
    ``tools.continuationServers``, or the host runs no continuation service. The tool should
    do its work synchronously or refuse; it must not invent a route."""


class InvalidCapability(ProducerError, CallerError):
    """The capability values are malformed or point away from loopback (the host's fault, or a
    forged header): the token is never sent anywhere but the local service."""


class ServiceUnavailable(ProducerError, RemoteError):
    """The service could not be reached, or kept failing, within the retry budget. The call is
    idempotent: retrying it later with the same arguments is safe."""


class RejectedByService(ProducerError, CallerError):
    """The service refused the request; retrying the same request will not help.

    ``status`` is the HTTP status and ``code`` the service's error code.
    """

    status = 0
    code = "rejected"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        super().__init__(message)


class InvalidRequest(RejectedByService):
    """The request broke a rule of the protocol (the producer's fault)."""


class NotAuthorized(RejectedByService):
    """The token is not valid for this operation."""


class Forbidden(RejectedByService):
    """The token is valid but does not grant this route or operation."""


class NotFound(RejectedByService):
    """No such continuation."""


class ClaimConflict(RejectedByService):
    """The task key or result was already used with different content (taskHash, deadline,
    binding, idempotency key or payload)."""


class CapabilityClosed(RejectedByService):
    """The claim capability is closed (the host's run settled) or the continuation no longer
    accepts a result. A claim refused this way created nothing."""


class TooLarge(RejectedByService):
    """The body is over the service's limit (a result is capped at 256 KiB)."""


class AdmissionLimited(RejectedByService):
    """The service holds too many active continuations (globally or for this origin)."""


_BY_STATUS: dict[int, type[RejectedByService]] = {
    400: InvalidRequest,
    401: NotAuthorized,
    403: Forbidden,
    404: NotFound,
    409: ClaimConflict,
    410: CapabilityClosed,
    413: TooLarge,
    429: AdmissionLimited,
}
# A 5xx answer decided nothing the caller can act on, and every call here is idempotent, so
# it is retried like a network error (within the same bound).
_RETRY_FROM_STATUS = 500


# -- hashing and time -------------------------------------------------------------------------
def task_hash(task: Any) -> str:
    """A ``taskHash`` for an immutable task description, hashed the same way as a payload."""
    return payload_hash(task)


def format_deadline(deadline: datetime | timedelta | str, *, now: datetime | None = None) -> str:
    """An RFC 3339 UTC timestamp with milliseconds, as the service expects.

    A ``timedelta`` is taken relative to ``now`` (default: the current time); a string is
    passed through unchanged so the service can judge it.
    """
    if isinstance(deadline, str):
        return deadline
    if isinstance(deadline, timedelta):
        deadline = (now or datetime.now(UTC)) + deadline
    if deadline.tzinfo is None:
        raise ValueError("deadline must be timezone-aware")
    dt = deadline.astimezone(UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


# -- capability -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClaimCapability:
    """The request-bound claim capability as the host handed it to this server.

    ``mode`` tells the server how the answer will be used (``reply``, ``capture``, ...);
    ``fingerprint`` identifies the binding without revealing it. ``token`` is hidden from
    ``repr`` and must not be logged or shown to a model.
    """

    claim_url: str
    fingerprint: str
    mode: str
    token: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.token or not self.fingerprint or not self.mode:
            raise InvalidCapability("claim capability is incomplete (token, fingerprint and mode are needed)")
        if not is_loopback_url(self.claim_url) or urlsplit(self.claim_url).scheme != "http":
            raise InvalidCapability("claim URL is not a loopback http URL; refusing to send the token")

    @classmethod
    def _from_values(cls, values: list[str | None]) -> Self | None:
        if all(v is None for v in values):
            return None
        url, token, fp, mode = values
        if url is None or token is None or fp is None or mode is None:
            raise InvalidCapability("claim capability is incomplete (some reserved values are missing)")
        return cls(claim_url=url, token=token, fingerprint=fp, mode=mode)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self | None:
        """Read the capability of a stdio server from its environment; None when absent."""
        env = os.environ if environ is None else environ
        return cls._from_values([env.get(name) for name in RESERVED_ENV])

    @classmethod
    def from_headers(cls, headers: Mapping[str, str] | Any) -> Self | None:
        """Read the capability of a streamable-HTTP server from one request's headers.

        ``headers`` may be any mapping (names compared case-insensitively) or an object with
        ``items()`` such as Starlette's ``Headers``. Returns None when no reserved header is
        present.
        """
        lowered: dict[str, str] = {}
        for name, value in headers.items():
            key = name.lower()
            if key in RESERVED_HEADERS:
                if key in lowered and lowered[key] != value:
                    raise InvalidCapability(f"reserved header {key} is repeated with different values")
                lowered[key] = value
        return cls._from_values([lowered.get(name) for name in RESERVED_HEADERS])

    @classmethod
    def from_mcp_context(cls, ctx: Any, environ: Mapping[str, str] | None = None) -> Self | None:
        """The capability for the MCP request behind ``ctx`` (a FastMCP ``Context``).

        Over HTTP only that request's headers count, never the process environment, so one
        run's capability cannot leak into another run's request; over stdio the environment
        the host spawned this process with is the binding.
        """
        request = getattr(getattr(ctx, "request_context", None), "request", None)
        if request is not None and hasattr(request, "headers"):
            return cls.from_headers(request.headers)
        return cls.from_env(environ)


# -- retry ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with full jitter for idempotent calls."""

    attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0

    def delay(self, attempt: int, rand: Callable[[], float]) -> float:
        """Delay before retry number ``attempt`` (1-based)."""
        return rand() * min(self.max_delay_s, self.base_delay_s * 2.0 ** (attempt - 1))


# -- client -----------------------------------------------------------------------------------
class ClaimHandle:
    """One claimed continuation: submit its result, poll its status.

    ``response`` is the service's claim response; persist it (``to_json``) if the work may
    outlive this process, and rebuild the handle with :meth:`Producer.resume`. It contains
    the result token, so store it like a credential.
    """

    def __init__(self, producer: Producer, response: ClaimResponse) -> None:
        self._producer = producer
        self.response = response

    @property
    def continuation_id(self) -> str:
        return self.response.continuation_id

    @property
    def expires_at(self) -> str:
        return self.response.expires_at

    @property
    def fingerprint(self) -> str:
        return self.response.fingerprint

    def __repr__(self) -> str:
        return f"<ClaimHandle {self.continuation_id} expires={self.expires_at}>"

    def to_json(self) -> bytes:
        return msgspec.json.encode(self.response)

    async def submit_result(self, payload: Any, idempotency_key: str) -> StatusBody:
        """Submit the one immutable result. Repeating an identical submission is safe; a
        different payload or key after acceptance raises :class:`ClaimConflict`."""
        return await self._producer.submit_result(self, payload, idempotency_key)

    async def status(self) -> StatusBody:
        return await self._producer.status(self)


class Producer:
    """HTTP client for claims and results. One per process; safe to share between tasks.

    Args:
        client: an ``httpx.AsyncClient`` to use (not closed by us); by default one is created
            that ignores proxy environment variables, because every request here goes to the
            local service and carries a credential.
        retry: the backoff policy for idempotent retries.
        sleep, rand: injected for tests.
    """

    def __init__(
        self,
        *,
        client: httpx.AsyncClient | None = None,
        retry: RetryPolicy = RetryPolicy(),
        timeout_s: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout_s, trust_env=False, follow_redirects=False)
        self._retry = retry
        self._sleep = sleep
        self._rand = rand

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()

    def resume(self, saved: bytes | ClaimResponse) -> ClaimHandle:
        """A handle for a claim made earlier (from :meth:`ClaimHandle.to_json`)."""
        response = saved if isinstance(saved, ClaimResponse) else _claim_decoder.decode(saved)
        return ClaimHandle(self, response)

    async def _request(
        self, method: str, url: str, token: str, body: Any = None, headers: Mapping[str, str] | None = None
    ) -> bytes:
        send_headers = {"Authorization": f"Bearer {token}", **(headers or {})}
        content = None
        if body is not None:
            content = msgspec.json.encode(body)
            send_headers["Content-Type"] = "application/json"
        attempt = 0
        while True:
            attempt += 1
            failure: str
            try:
                response = await self._client.request(method, url, content=content, headers=send_headers)
            except httpx.TransportError as exc:
                failure = type(exc).__name__
            else:
                if response.status_code < 300:
                    return response.content
                if response.status_code < _RETRY_FROM_STATUS:
                    raise _rejection(response)
                failure = f"HTTP {response.status_code}"
            if attempt >= self._retry.attempts:
                raise ServiceUnavailable(
                    f"{method} {_display(url)} failed after {attempt} attempt(s): {failure}"
                )
            delay = self._retry.delay(attempt, self._rand)
            log.debug("%s %s: %s; retrying in %.2fs", method, _display(url), failure, delay)
            await self._sleep(delay)

    async def claim(
        self,
        capability: ClaimCapability | None,
        *,
        task_key: str,
        task_hash: str,
        deadline: datetime | timedelta | str,
    ) -> ClaimHandle:
        """Claim a continuation during the current MCP request.

        Raises :class:`NoCapability` when ``capability`` is None (this server was not
        selected), :class:`CapabilityClosed` when the host already settled the run, and
        :class:`ClaimConflict` when ``task_key`` was claimed with other content.
        """
        if capability is None:
            raise NoCapability("this server holds no continuation claim capability")
        body = {"taskKey": task_key, "taskHash": task_hash, "deadline": format_deadline(deadline)}
        data = await self._request("POST", capability.claim_url, capability.token, body)
        response = _claim_decoder.decode(data)
        _check_same_origin(capability.claim_url, response)
        return ClaimHandle(self, response)

    async def detached_claim(
        self,
        base_url: str,
        *,
        service_name: str,
        token: str,
        route: str,
        task_key: str,
        task_hash: str,
        deadline: datetime | timedelta | str,
    ) -> ClaimHandle:
        """Claim on a configured named route as a detached service (no interactive origin).

        The route is a host-owned policy: it names its own destination, and nothing sent here
        can change it.
        """
        url = paths.url(paths.DETACHED_CLAIM, base_url)
        if not is_loopback_url(url):
            raise InvalidCapability("service URL is not loopback; refusing to send the token")
        body = {
            "route": route,
            "taskKey": task_key,
            "taskHash": task_hash,
            "deadline": format_deadline(deadline),
        }
        data = await self._request("POST", url, token, body, headers={SERVICE_NAME_HEADER: service_name})
        response = _claim_decoder.decode(data)
        _check_same_origin(url, response)
        return ClaimHandle(self, response)

    async def submit_result(self, handle: ClaimHandle, payload: Any, idempotency_key: str) -> StatusBody:
        body = {
            "idempotencyKey": idempotency_key,
            "payloadHash": payload_hash(payload),
            "payload": payload,
        }
        r = handle.response
        return _status_decoder.decode(await self._request("PUT", r.result_url, r.result_token, body))

    async def status(self, handle: ClaimHandle) -> StatusBody:
        r = handle.response
        return _status_decoder.decode(await self._request("GET", r.status_url, r.result_token))


def _display(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def _check_same_origin(request_url: str, response: ClaimResponse) -> None:
    # The result token is sent to resultUrl/statusUrl later; they must be the service we
    # claimed from, never somewhere a tampered response points.
    want = _origin(request_url)
    for url in (response.result_url, response.status_url):
        if _origin(url) != want:
            raise InvalidCapability("claim response points result/status URLs at another origin")


def _rejection(response: httpx.Response) -> RejectedByService:
    status = response.status_code
    code = "http_error"
    message = f"HTTP {status}"
    try:
        err = msgspec.json.decode(response.content)["error"]
        code = str(err["code"])
        message = str(err["message"])
    except (msgspec.DecodeError, KeyError, TypeError):
        pass
    kind = _BY_STATUS.get(status, RejectedByService)
    return kind(message, status=status, code=code)

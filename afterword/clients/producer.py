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
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self
from urllib.parse import urlsplit

import anyio
import httpx
import msgspec

from ..config.mcp import is_loopback_url
from ..continuations import rules
from ..continuations.rules import payload_hash
from ..protocol import paths
from ..protocol.headers import SERVICE_NAME_HEADER
from ..protocol.wire import ClaimResponse, StatusBody
from .capability import ClaimCapability
from .producer_errors import (
    AdmissionLimited,
    CapabilityClosed,
    ClaimConflict,
    Forbidden,
    InvalidCapability,
    InvalidRequest,
    NoCapability,
    NotAuthorized,
    NotFound,
    ProducerError,
    RejectedByService,
    ServiceUnavailable,
    TooLarge,
    rejection,
)

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

_claim_decoder = msgspec.json.Decoder(ClaimResponse)
_status_decoder = msgspec.json.Decoder(StatusBody)


# A 5xx answer decided nothing the caller can act on, and every call here is idempotent, so
# it is retried like a network error (within the same bound).
_RETRY_FROM_STATUS = 500


# -- hashing and time -------------------------------------------------------------------------
def task_hash(task: Any) -> str:
    """A ``taskHash`` for an immutable task description: sha256 of its sorted compact JSON.

    The service only compares it with the taskHash of a repeated claim, so it keeps the form
    producers have always sent: a claim repeated across an upgrade must not look different.
    """
    return rules.canonical_hash(rules.sorted_json(task))


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
                    raise rejection(response)
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

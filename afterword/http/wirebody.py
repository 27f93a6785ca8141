"""The request and answer rules of the HTTP API that need no web framework: the bearer
credential, the body size checks, the typed JSON decode and every error's answer.
The Quart app uses them through ``messages.py`` and its error handlers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from werkzeug.exceptions import HTTPException

from ..continuations.errors import ContinuationError, InvalidRequest, RequestTooLarge, Unauthorized
from ..disk import DiskError, StorageFullError
from ..protocol.wire import (
    ClaimRequest,
    DetachedClaimRequest,
    ErrorBody,
    ErrorDetail,
    ResolveRequest,
    ResultRequest,
    RetryRequest,
)
from .strictjson import check_body

if TYPE_CHECKING:
    from ..app.service import ContinuationService

T = TypeVar("T")
log = logging.getLogger("afterword.http")
JSON = "application/json"
STORAGE_RETRY_AFTER_S = 5
HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "invalid_request",
    408: "timeout",
    409: "conflict",
    410: "closed",
    413: "too_large",
    414: "too_large",
    429: "admission_limit",
    431: "too_large",
}

encoder = msgspec.json.Encoder()
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t)
    for t in (ClaimRequest, DetachedClaimRequest, ResultRequest, ResolveRequest, RetryRequest)
}


def bearer_token(authorization: str) -> str:
    """The token of an ``Authorization: Bearer`` header value."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("an Authorization: Bearer credential is required")
    return token.strip()


def check_declared_length(length: int | None, limit: int) -> None:
    """Refuse a body whose Content-Length already says it is over ``limit`` (nothing read)."""
    if length is not None and length > limit:
        raise RequestTooLarge(f"request body exceeds {limit} bytes")


def check_read_length(data: bytes, limit: int) -> bytes:
    """``data``, or :class:`RequestTooLarge` if the body that arrived (chunked, say) is over ``limit``."""
    if len(data) > limit:
        raise RequestTooLarge(f"request body exceeds {limit} bytes")
    return data


def decode_typed(kind: type[T], content_type: str, data: bytes) -> T:
    """A JSON request body of wire type ``kind``, its Content-Type header checked first."""
    if content_type.split(";")[0].strip().lower() != JSON:
        raise InvalidRequest("Content-Type must be application/json")
    return decode_json(kind, data)


def decode_json(kind: type[T], data: bytes) -> T:
    """A request body of wire type ``kind``; any defect is :class:`InvalidRequest`."""
    check_body(data)
    decoder = _decoders.get(kind)
    if decoder is None:  # a body type of another route module: built once, on first use
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(data)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid body: {exc}") from None
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequest("body is not valid JSON") from None


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """An error's status, its JSON envelope, and any header beyond the content type."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def envelope(status: int, code: str, message: str, headers: tuple[tuple[str, str], ...] = ()) -> ErrorAnswer:
    body = encoder.encode(ErrorBody(error=ErrorDetail(code=code, message=message)))
    return ErrorAnswer(status, body, headers)


def domain_error(exc: ContinuationError) -> ErrorAnswer:
    return envelope(exc.status, exc.code, str(exc))


def storage_error(exc: DiskError, service: ContinuationService, method: str) -> ErrorAnswer:
    """Out of space before anything was written: the store stays writable and a retry succeeds
    once space is freed. Any other disk failure needs a restart first."""
    if isinstance(exc, StorageFullError):
        return envelope(
            503,
            "storage_full",
            "the state directory's file system is full; retry later",
            (("Retry-After", str(STORAGE_RETRY_AFTER_S)),),
        )
    problem = service.store.storage_problem()
    code = problem[0] if problem is not None else "disk_failed"
    log.error("storage failure handling %s: %s", method, type(exc).__name__)
    return envelope(
        503, code, "the service cannot write its state; an operator must fix the disk and restart it"
    )


def http_error(exc: HTTPException) -> ErrorAnswer:
    status = exc.code or 500
    return envelope(status, HTTP_CODES.get(status, "internal"), exc.name)


def unexpected_error(exc: Exception, method: str, rule: str) -> ErrorAnswer:
    # The rule, not the raw path: a path is attacker-chosen text.
    log.error("unexpected error handling %s %s: %s", method, rule, type(exc).__name__)
    return envelope(500, "internal", "internal error")

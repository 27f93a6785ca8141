"""Reading a request and writing a JSON answer: the helpers every route module shares (the
continuation API in ``app.py``, the host API in ``hostapi.py``), so neither imports the other's.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from quart import Response, request

from ..continuations.errors import InvalidRequest, TooLarge, Unauthorized
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

__all__ = ["bearer", "decode_json", "decode_request", "error_response", "json_response", "query_int", "read_body"]

T = TypeVar("T")
_encoder = msgspec.json.Encoder()
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t)
    for t in (ClaimRequest, DetachedClaimRequest, ResultRequest, ResolveRequest, RetryRequest)
}


def json_response(body: object, status: int = 200) -> Response:
    return Response(_encoder.encode(body), status=status, content_type="application/json")


def error_response(status: int, code: str, message: str) -> Response:
    return json_response(ErrorBody(error=ErrorDetail(code=code, message=message)), status)


def bearer() -> str:
    """The token of the request's ``Authorization: Bearer`` header."""
    value = request.headers.get("Authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("an Authorization: Bearer credential is required")
    return token.strip()


async def read_body(limit: int) -> bytes:
    """The request body, refused past ``limit`` bytes (before reading when it says so)."""
    length = request.content_length
    if length is not None and length > limit:
        raise TooLarge(f"request body exceeds {limit} bytes")
    raw = await request.get_data(cache=False)
    data = raw if isinstance(raw, bytes) else raw.encode()
    if len(data) > limit:
        raise TooLarge(f"request body exceeds {limit} bytes")
    return data


def decode_request(kind: type[T], data: bytes) -> T:
    """A JSON request body (its Content-Type checked) of wire type ``kind``."""
    ctype = request.headers.get("Content-Type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
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


_ASCII_DIGITS = re.compile(r"[0-9]{1,9}")


def query_int(name: str) -> int | None:
    """A non-negative integer query parameter written in ASCII digits only.

    ``str.isdigit`` also accepts superscripts and other scripts' digits, which ``int`` then
    either rejects (a 500) or reads as a number nobody typed."""
    raw = request.args.get(name)
    if raw is None:
        return None
    if not _ASCII_DIGITS.fullmatch(raw):
        raise InvalidRequest(f"{name} must be a positive integer in ASCII digits")
    return int(raw)

"""Reading a request and writing a JSON answer inside Quart: the helpers every route module
shares (the continuation API in ``app.py``, the host API in ``hostapi.py``), so neither imports
the other's. The rules themselves live in ``wirebody.py``, shared with the ASGI fast path.
"""

from __future__ import annotations

import re
from typing import TypeVar

from quart import Response, request

from ..continuations.errors import InvalidRequest
from .wirebody import (
    JSON,
    ErrorAnswer,
    bearer_token,
    check_declared_length,
    check_read_length,
    decode_typed,
    encoder,
)
from .wirebody import decode_json as decode_json
from .wirebody import envelope as _envelope

__all__ = [
    "QUART_REQUEST",
    "answer",
    "bearer",
    "decode_json",
    "decode_request",
    "error_response",
    "json_response",
    "query_int",
    "read_body",
]

T = TypeVar("T")


def json_response(body: object, status: int = 200) -> Response:
    return Response(encoder.encode(body), status=status, content_type=JSON)


def answer(error: ErrorAnswer) -> Response:
    """The Quart response of an error answer (its extra headers after the content headers)."""
    response = Response(error.body, status=error.status, content_type=JSON)
    for name, value in error.headers:
        response.headers[name] = value
    return response


def error_response(status: int, code: str, message: str) -> Response:
    return answer(_envelope(status, code, message))


def bearer() -> str:
    """The token of the request's ``Authorization: Bearer`` header."""
    return bearer_token(request.headers.get("Authorization", ""))


async def read_body(limit: int) -> bytes:
    """The request body, refused past ``limit`` bytes (before reading when it says so)."""
    check_declared_length(request.content_length, limit)
    raw = await request.get_data(cache=False)
    return check_read_length(raw if isinstance(raw, bytes) else raw.encode(), limit)


def decode_request(kind: type[T], data: bytes) -> T:
    """A JSON request body (its Content-Type checked) of wire type ``kind``."""
    return decode_typed(kind, request.headers.get("Content-Type", ""), data)


class _QuartIncoming:
    """The current Quart request as ``producer.Incoming``."""

    def header(self, name: str) -> str:
        return request.headers.get(name, "")

    async def body(self, limit: int) -> bytes:
        return await read_body(limit)


QUART_REQUEST = _QuartIncoming()


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

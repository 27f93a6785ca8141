"""The producer routes' work: claim, detached claim, result and status.

Each is a function of the service and an :class:`Incoming` request (a header lookup and a
body reader), called by the Quart routes in ``app.py``, so the order of checks (the
credential before any body byte is read), the size limits and the decoding live in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..continuations.errors import Unauthorized
from ..continuations.rules import MAX_CLAIM_BODY, MAX_RESULT_BODY
from ..protocol.headers import SERVICE_NAME_HEADER
from ..protocol.wire import ClaimRequest, ClaimResponse, DetachedClaimRequest, ResultRequest, StatusBody
from .wirebody import bearer_token, decode_typed

if TYPE_CHECKING:
    from ..app.service import ContinuationService


class Incoming(Protocol):
    """What a route needs of a request."""

    def header(self, name: str) -> str:
        """The first value of header ``name`` (any case), or ``""``."""
        ...

    async def body(self, limit: int) -> bytes:
        """The whole body, refused past ``limit`` bytes (before reading when it says so)."""
        ...


async def claim(service: ContinuationService, req: Incoming) -> ClaimResponse:
    token = bearer_token(req.header("Authorization"))
    service.authenticate_claim(token)  # from headers: no body is read for a stranger
    body = decode_typed(ClaimRequest, req.header("Content-Type"), await req.body(MAX_CLAIM_BODY))
    return await service.claim(token, body)


async def detached_claim(service: ContinuationService, req: Incoming) -> ClaimResponse:
    token = bearer_token(req.header("Authorization"))
    name = req.header(SERVICE_NAME_HEADER)
    if not name:
        raise Unauthorized(f"{SERVICE_NAME_HEADER} is required")
    service.authenticate_detached(name, token)
    body = decode_typed(DetachedClaimRequest, req.header("Content-Type"), await req.body(MAX_CLAIM_BODY))
    return await service.detached_claim(name, token, body)


async def result(service: ContinuationService, req: Incoming, cid: str) -> StatusBody:
    token = bearer_token(req.header("Authorization"))
    service.authenticate_result(cid, token)
    data = await req.body(MAX_RESULT_BODY)
    body = decode_typed(ResultRequest, req.header("Content-Type"), data)
    return await service.submit_result(cid, token, body, len(data))


def status(service: ContinuationService, req: Incoming, cid: str) -> StatusBody:
    return service.status(cid, bearer_token(req.header("Authorization")))

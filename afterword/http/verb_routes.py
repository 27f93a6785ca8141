"""The operator verbs' request handling, shared by the two surfaces that offer them: the
operator API (``app.py``, operator capability) and the host API (``hostapi.py``, host
capability). Each route checks its own credential first, then calls one of these."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response

from ..continuations.rules import MAX_CLAIM_BODY
from ..protocol.wire import ResolveRequest, RetryRequest
from .messages import decode_request, json_response, read_body

if TYPE_CHECKING:
    from ..app.service import ContinuationService


async def retry(service: ContinuationService, cid: str) -> Response:
    data = await read_body(MAX_CLAIM_BODY)
    req = decode_request(RetryRequest, data) if data else RetryRequest()  # the body is optional
    return json_response(await service.retry_continuation(cid, allow_unknown=req.allow_unknown))


async def cancel(service: ContinuationService, cid: str) -> Response:
    return json_response(await service.cancel_continuation(cid))


async def resolve(service: ContinuationService, cid: str) -> Response:
    req = decode_request(ResolveRequest, await read_body(MAX_CLAIM_BODY))
    verdict = {"kind": req.kind, "delivery_id": req.delivery_id}
    return json_response(await service.resolve_continuation_delivery(cid, verdict))

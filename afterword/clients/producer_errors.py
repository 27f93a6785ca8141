"""What the producer helper raises: every refusal typed by the HTTP status it came with.

A tool server catches these by meaning (:class:`ClaimConflict`, :class:`CapabilityClosed`,
...); none is retried, and no message carries a token.
"""

from __future__ import annotations

import httpx
import msgspec

from ..errors import AfterwordError, CallerError, RemoteError

__all__ = [
    "AdmissionLimited",
    "CapabilityClosed",
    "ClaimConflict",
    "Forbidden",
    "InvalidCapability",
    "InvalidRequest",
    "NoCapability",
    "NotAuthorized",
    "NotFound",
    "ProducerError",
    "RejectedByService",
    "ServiceUnavailable",
    "TooLarge",
    "rejection",
]


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


def rejection(response: httpx.Response) -> RejectedByService:
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

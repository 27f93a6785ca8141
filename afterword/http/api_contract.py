"""What one operation of the HTTP API is, as data, and the documented meaning of each error
status and credential: the vocabulary :mod:`.operations` and :mod:`.host_operations` list
their operations in, and :mod:`afterword.http.openapi` renders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..protocol.headers import SERVICE_NAME_HEADER

ERRORS = {
    400: "invalid_request: malformed request, body or parameter, or a Host header that does not "
    "name this loopback service",
    401: "unauthorized: no valid credential for this operation",
    403: "forbidden: the credential does not grant this destination",
    404: "not_found: no such continuation (or run)",
    408: "timeout: the request body did not arrive within the body deadline",
    409: "conflict: contradicts what was already accepted, or the state does not allow it (an "
    "operator verb while a delivery attempt is in flight, or one that would drop or repeat "
    "posted chunks, is refused with the reason); closed: a task handle for a run that is closed "
    "but not settled",
    410: "closed: the capability, continuation or run no longer accepts this; or, from an "
    "operator verb (retry, cancel, resolve), compacted: retention compacted the record, its "
    "payload and answer are gone and only its outcome remains (show and list still report it)",
    413: "too_large: the body exceeds this route's limit, or the origin snapshot its quota",
    429: "admission_limit: too many active continuations (claims), or too many open runs "
    "(beginRun, with Retry-After)",
    503: "unavailable: this service lacks what the request needs (following an MCP task without "
    "the MCP SDK: install afterword[mcp])",
}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    operation_id: str
    summary: str
    security: str | None
    request: type | None
    response: type | None  # None: Prometheus text
    errors: tuple[int, ...]
    request_optional: bool = False
    query: tuple[tuple[str, dict[str, Any]], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    also_security: str | None = None  # a second credential that opens the operation too


SECURITY = {
    "claimCapability": "The run's claim token, handed to a selected tool server with its MCP request",
    "resultToken": "The resultToken from the claim response; valid for that continuation only",
    "detachedToken": f"The detached service's configured token (with {SERVICE_NAME_HEADER})",
    "operatorCapability": "Derived from the state directory's secret by the service's owner",
    "metricsCapability": "Read-only; opens the metrics only (afterword continuations metrics-token)",
    "hostCapability": "Opens the /v1/host API only (afterword continuations host-token --file PATH)",
}

"""Every operation of the HTTP API as data: its method and path, the credential that opens it,
its request and response bodies, and the error statuses it can answer.

:mod:`afterword.http.openapi` turns this table into the OpenAPI document, and
``tests/e2e/test_openapi.py`` checks it against the routes the app registers and the statuses the
service really answers. Paths come from :mod:`afterword.protocol.paths`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..continuations.model import STATES
from ..protocol import paths
from ..protocol.headers import SERVICE_NAME_HEADER
from ..protocol.hostapi_wire import BeginRunRequest, CapturedTextBody, FinalizeRequest, RunBody
from ..protocol.tasks import AdoptedTask, AdoptTaskRequest, TaskOutcome, TaskReport
from ..protocol.wire import (
    ClaimRequest,
    ClaimResponse,
    DetachedClaimRequest,
    DetailBody,
    HealthBody,
    ListResponse,
    LivezBody,
    ResolveRequest,
    ResultRequest,
    RetryRequest,
    StatusBody,
    UiLoginBody,
)

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


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "post",
        paths.CLAIM,
        "claim",
        "Claim a continuation during an MCP request",
        "claimCapability",
        ClaimRequest,
        ClaimResponse,
        (400, 401, 408, 409, 410, 413, 429),
    ),
    Operation(
        "post",
        paths.DETACHED_CLAIM,
        "detachedClaim",
        "Claim a continuation on a configured named route (detached service)",
        "detachedToken",
        DetachedClaimRequest,
        ClaimResponse,
        (400, 401, 403, 408, 409, 413, 429),
        headers=((SERVICE_NAME_HEADER, "The configured detached service's name"),),
    ),
    Operation(
        "put",
        paths.RESULT,
        "submitResult",
        "Submit the one result of a continuation",
        "resultToken",
        ResultRequest,
        StatusBody,
        (400, 401, 404, 408, 409, 410, 413),
    ),
    Operation(
        "post",
        paths.RESULT,
        "submitResultByPost",
        "Submit the one result (POST form)",
        "resultToken",
        ResultRequest,
        StatusBody,
        (400, 401, 404, 408, 409, 410, 413),
    ),
    Operation(
        "get",
        paths.STATUS,
        "status",
        "Read a continuation's status",
        "resultToken",
        None,
        StatusBody,
        (400, 401, 404),
    ),
    Operation(
        "get",
        paths.LIST,
        "listContinuations",
        "List continuations (keyset pages)",
        "operatorCapability",
        None,
        ListResponse,
        (400, 401),
        query=(
            ("limit", {"type": "string", "pattern": "^[0-9]{1,9}$"}),
            ("cursor", {"type": "string"}),
            ("state", {"type": "string", "enum": list(STATES)}),
            ("server", {"type": "string"}),
            ("route", {"type": "string"}),
            ("order", {"type": "string", "enum": ["oldest", "newest"]}),
        ),
    ),
    Operation(
        "get",
        paths.SHOW,
        "showContinuation",
        "One continuation in full: status, binding names, task key and state history",
        "operatorCapability",
        None,
        DetailBody,
        (400, 401, 404),
    ),
    Operation(
        "get",
        paths.HEALTH,
        "health",
        "Service health",
        "operatorCapability",
        None,
        HealthBody,
        (400, 401),
    ),
    Operation(
        "post",
        paths.RETRY,
        "retry",
        "Retry a failed or unknown delivery",
        "operatorCapability",
        RetryRequest,
        StatusBody,
        (400, 401, 404, 408, 409, 410, 413),
        request_optional=True,
    ),
    Operation(
        "post",
        paths.CANCEL,
        "cancel",
        "Cancel a continuation",
        "operatorCapability",
        None,
        StatusBody,
        (400, 401, 404, 409, 410),
    ),
    Operation(
        "post",
        paths.ACKNOWLEDGE,
        "acknowledge",
        "Acknowledge a dead letter, an expiry or a delivery missing from history",
        "operatorCapability",
        None,
        StatusBody,
        (400, 401, 404, 409),
    ),
    Operation(
        "post",
        paths.RESOLVE,
        "resolve",
        "Resolve an unknown delivery",
        "operatorCapability",
        ResolveRequest,
        StatusBody,
        (400, 401, 404, 408, 409, 410, 413),
    ),
    Operation(
        "post",
        paths.UI_LOGIN,
        "statusPageLogin",
        "A one-time login link to the status page (valid once, for a minute)",
        "operatorCapability",
        None,
        UiLoginBody,
        (400, 401),
    ),
    Operation(
        "get",
        paths.METRICS,
        "metrics",
        "Prometheus metrics",
        "operatorCapability",
        None,
        None,
        (400, 401),
        also_security="metricsCapability",
    ),
    Operation(
        "get",
        paths.LIVEZ,
        "livez",
        "Liveness: the process serves HTTP (no credential; reveals nothing else)",
        None,
        None,
        LivezBody,
        (400,),
    ),
    Operation(
        "get",
        paths.OPENAPI,
        "openapi",
        "This document",
        None,
        None,
        dict,
        (400,),
    ),
)

_HOST = "hostCapability"
HOST_OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "post",
        paths.HOST_RUNS,
        "beginRun",
        "Bind a run: one claim capability per selected server (an identical repeat is idempotent)",
        _HOST,
        BeginRunRequest,
        RunBody,
        (400, 401, 408, 409, 413, 429),
    ),
    Operation(
        "get",
        paths.HOST_RUN,
        "getRun",
        "A run's state, lease and claims",
        _HOST,
        None,
        RunBody,
        (400, 401, 404),
    ),
    Operation(
        "post",
        paths.HOST_HEARTBEAT,
        "heartbeatRun",
        "Renew the run's lease (every run call renews it too)",
        _HOST,
        None,
        RunBody,
        (400, 401, 404, 410),
    ),
    Operation(
        "post",
        paths.HOST_CLOSE,
        "closeRun",
        "Close the run's capabilities to new claims and drain admitted ones",
        _HOST,
        None,
        RunBody,
        (400, 401, 404),
    ),
    Operation(
        "post",
        paths.HOST_FINALIZE,
        "finalizeRun",
        "Bind the origin snapshot to every active claim, before the host commits its turn",
        _HOST,
        FinalizeRequest,
        RunBody,
        (400, 401, 404, 408, 410, 413),
    ),
    Operation(
        "post",
        paths.HOST_ACTIVATE,
        "activateRun",
        "The host committed its turn: publish the group activation marker",
        _HOST,
        None,
        RunBody,
        (400, 401, 404, 410),
    ),
    Operation(
        "post",
        paths.HOST_ABANDON,
        "abandonRun",
        "The turn failed before commit: its continuations take the fixed fallback answer",
        _HOST,
        None,
        RunBody,
        (400, 401, 404),
    ),
    Operation(
        "post", paths.HOST_TASKS, "adoptTask", "Adopt an MCP task handle as a continuation of the run",
        _HOST, AdoptTaskRequest, AdoptedTask, (400, 401, 404, 408, 409, 410, 413, 429, 503),
    ),
    Operation("get", paths.HOST_HEALTH, "hostHealth", "Service health", _HOST, None, HealthBody, (400, 401)),
    Operation(
        "get",
        paths.HOST_LIST,
        "hostListContinuations",
        "List continuations (keyset pages)",
        _HOST,
        None,
        ListResponse,
        (400, 401),
        query=(
            ("limit", {"type": "string", "pattern": "^[0-9]{1,9}$"}),
            ("cursor", {"type": "string"}),
        ),
    ),
    Operation(
        "get",
        paths.HOST_CAPTURED_TEXT,
        "capturedText",
        "The retained text of a delivered capture continuation (host capability only)",
        _HOST,
        None,
        CapturedTextBody,
        (400, 401, 404),
    ),
    Operation(
        "post",
        paths.HOST_RETRY,
        "hostRetry",
        "Retry a failed or unknown delivery",
        _HOST,
        RetryRequest,
        StatusBody,
        (400, 401, 404, 408, 409, 410, 413),
        request_optional=True,
    ),
    Operation(
        "post",
        paths.HOST_CANCEL,
        "hostCancel",
        "Cancel a continuation",
        _HOST,
        None,
        StatusBody,
        (400, 401, 404, 409, 410),
    ),
    Operation(
        "post",
        paths.HOST_RESOLVE,
        "hostResolve",
        "Resolve an unknown delivery",
        _HOST,
        ResolveRequest,
        StatusBody,
        (400, 401, 404, 408, 409, 410, 413),
    ),
    Operation(
        "post", paths.HOST_TASK_OUTCOME, "reportTaskOutcome", "Report tasks/get's answer for a host-followed task",
        _HOST, TaskOutcome, TaskReport, (400, 401, 404, 408, 409, 413),
    ),
)
OPERATIONS = OPERATIONS + HOST_OPERATIONS

SECURITY = {
    "claimCapability": "The run's claim token, handed to a selected tool server with its MCP request",
    "resultToken": "The resultToken from the claim response; valid for that continuation only",
    "detachedToken": f"The detached service's configured token (with {SERVICE_NAME_HEADER})",
    "operatorCapability": "Derived from the state directory's secret by the service's owner",
    "metricsCapability": "Read-only; opens the metrics only (afterword continuations metrics-token)",
    "hostCapability": "Opens the /v1/host API only (afterword continuations host-token --file PATH)",
}

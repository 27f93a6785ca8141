"""Every URL path of the HTTP API, in one place.

The server registers its routes from these templates (:func:`route`), the OpenAPI document
uses them as its keys, and the service and the clients build URLs with :func:`url`, so a path
cannot drift between the side that serves it and the side that calls it. Templates use the
OpenAPI placeholder ``{cid}``; the contract itself is "docs/design.md, Contracts: HTTP".
"""

from __future__ import annotations

from urllib.parse import quote

__all__ = [
    "ACKNOWLEDGE",
    "CANCEL",
    "CLAIM",
    "DETACHED_CLAIM",
    "HEALTH",
    "HOST_ABANDON",
    "HOST_ACTIVATE",
    "HOST_CANCEL",
    "HOST_CAPTURED_TEXT",
    "HOST_CLOSE",
    "HOST_FINALIZE",
    "HOST_HEALTH",
    "HOST_HEARTBEAT",
    "HOST_LIST",
    "HOST_RESOLVE",
    "HOST_RETRY",
    "HOST_RUN",
    "HOST_RUNS",
    "HOST_TASKS",
    "HOST_TASK_OUTCOME",
    "LIST",
    "LIVEZ",
    "METRICS",
    "OPENAPI",
    "OPERATOR_PREFIX",
    "RESOLVE",
    "RESULT",
    "RETRY",
    "SHOW",
    "STATUS",
    "UI_LOGIN",
    "route",
    "url",
]

LIVEZ = "/v1/livez"
OPENAPI = "/v1/openapi.json"

# Producer routes: a claim capability, a detached token, or a result token opens them.
CLAIM = "/v1/continuations/claim"
DETACHED_CLAIM = "/v1/continuations/detached/claim"
STATUS = "/v1/continuations/{cid}"
RESULT = "/v1/continuations/{cid}/result"

# Operator routes: the operator capability opens them (metrics also takes the metrics one).
OPERATOR_PREFIX = "/v1/operator/"  # every route below starts with it (the transport reserves slots by it)
LIST = "/v1/operator/continuations"
SHOW = "/v1/operator/continuations/{cid}"
RETRY = "/v1/operator/continuations/{cid}/retry"
CANCEL = "/v1/operator/continuations/{cid}/cancel"
ACKNOWLEDGE = "/v1/operator/continuations/{cid}/acknowledge"
RESOLVE = "/v1/operator/continuations/{cid}/resolve"
HEALTH = "/v1/operator/health"
METRICS = "/v1/operator/metrics"
UI_LOGIN = "/v1/operator/ui/login"  # mints a one-time link to the status page (/ui)

# Host API routes: the host capability opens them (docs/host-api.md).
HOST_RUNS = "/v1/host/runs"
HOST_RUN = "/v1/host/runs/{runId}"
HOST_HEARTBEAT = HOST_RUN + "/heartbeat"
HOST_CLOSE = HOST_RUN + "/close"
HOST_FINALIZE = HOST_RUN + "/finalize"
HOST_ACTIVATE = HOST_RUN + "/activate"
HOST_ABANDON = HOST_RUN + "/abandon"
HOST_TASKS = HOST_RUN + "/tasks"  # adopt an MCP task handle (docs/tasks-bridge.md)
HOST_HEALTH = "/v1/host/health"
HOST_LIST = "/v1/host/continuations"
HOST_CAPTURED_TEXT = "/v1/host/continuations/{cid}/captured-text"
HOST_RETRY = "/v1/host/continuations/{cid}/retry"
HOST_CANCEL = "/v1/host/continuations/{cid}/cancel"
HOST_RESOLVE = "/v1/host/continuations/{cid}/resolve"
HOST_TASK_OUTCOME = "/v1/host/continuations/{cid}/task-outcome"


def route(template: str) -> str:
    """``template`` in Quart's rule syntax (``{cid}`` becomes ``<cid>``)."""
    return template.replace("{cid}", "<cid>").replace("{runId}", "<runId>")


def url(template: str, base: str = "", *, cid: str | None = None, run_id: str | None = None) -> str:
    """``base`` (no trailing slash needed) joined with ``template``, the ids percent-encoded.

    Every character that could end a path segment or start a query is encoded, so an id read
    from a terminal or a file can only ever name one continuation or run."""
    path = template
    if cid is not None:
        path = path.replace("{cid}", quote(cid, safe=""))
    if run_id is not None:
        path = path.replace("{runId}", quote(run_id, safe=""))
    if "{" in path:
        raise ValueError(f"{template} needs a continuation id or run id")
    return base.rstrip("/") + path

"""The host API routes (``/v1/host/...``): decode, call the run registry or the app handle,
encode. Every route needs the host capability; nothing here accepts the operator's.

The run operations are the app handle's ``begin_run`` and ``RunBinding`` methods reached over
loopback HTTP (see docs/host-api.md); the continuation operations are the handle's operator
verbs, plus captured text, which only the host capability can read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quart import Quart, Response, request
from quart.wrappers import Request

from ..app.hostruns import OpenRunsLimit, host_runs
from ..blobs import BlobQuotaExceeded, BlobTooLarge
from ..continuations.errors import RequestTooLarge
from ..continuations.rules import MAX_CLAIM_BODY
from ..protocol import paths
from ..protocol.hostapi_wire import BeginRunRequest, CapturedTextBody, FinalizeRequest
from ..protocol.tasks import AdoptTaskRequest, TaskOutcome
from . import verb_routes as verbs
from .messages import bearer as _bearer
from .messages import decode_request as _decode
from .messages import error_response, json_response, query_int
from .messages import read_body as _body
from .ui.routes import FORM_LIMIT

if TYPE_CHECKING:
    from ..app.service import ContinuationService

# The history a host sends to finalize: room for a whole snapshot (at most 256 KiB of
# content) with its JSON framing and some older turns for size pressure to drop. It is the one
# route whose body may exceed the result limit (see FinalizeSizedRequest).
MAX_FINALIZE_BODY = 1024 * 1024
# A task's outcome carries the tool's whole CallToolResult, which may be larger than the
# payload it yields: room for it, so a result over the payload limit is decided by the outcome
# table (task_result_too_large) instead of being refused at the door.
MAX_TASK_OUTCOME_BODY = 4 * 1024 * 1024
HOST_CONTINUATIONS = paths.HOST_LIST + "/"


class FinalizeSizedRequest(Request):
    """Quart sizes a request's body buffer when it creates the request, before routing, from
    ``MAX_CONTENT_LENGTH``; this lets the host's finalize route alone take its larger body
    while every other route keeps the app-wide cap (and the status page's forms a smaller one)."""

    def __init__(self, method: str, scheme: str, path: str, *args: Any, **kwargs: Any) -> None:
        if method == "POST" and path.startswith(paths.HOST_RUNS + "/") and path.endswith("/finalize"):
            kwargs["max_content_length"] = MAX_FINALIZE_BODY + 4096
        elif method == "POST" and path.startswith(HOST_CONTINUATIONS) and path.endswith("/task-outcome"):
            kwargs["max_content_length"] = MAX_TASK_OUTCOME_BODY + 4096
        elif method == "POST" and path.startswith("/ui/"):
            # A status page form: its cap must hold for a chunked body too, which announces
            # no length for the route to check first.
            kwargs["max_content_length"] = FORM_LIMIT
        super().__init__(method, scheme, path, *args, **kwargs)


def add_host_routes(app: Quart, service: ContinuationService) -> None:
    """Register the host API on ``app`` (called by :func:`afterword.http.app.create_app`)."""
    runs = host_runs(service)
    app.request_class = FinalizeSizedRequest

    def _host() -> None:
        service.verify_host(_bearer())

    @app.errorhandler(OpenRunsLimit)
    async def _open_runs_limit(exc: OpenRunsLimit) -> Response:
        response = error_response(exc.status, exc.code, str(exc))
        response.headers["Retry-After"] = str(exc.retry_after_s)
        return response

    @app.post(paths.HOST_RUNS)
    async def host_begin_run() -> Response:
        _host()
        req = _decode(BeginRunRequest, await _body(MAX_CLAIM_BODY))
        run = await runs.begin(req.run_id, req.conversation_id, req.reply_to, req.mode)
        return json_response(runs.body(run))

    @app.get(paths.route(paths.HOST_RUN))
    async def host_get_run(runId: str) -> Response:
        _host()
        return json_response(runs.body(runs.get(runId)))

    @app.post(paths.route(paths.HOST_HEARTBEAT))
    async def host_heartbeat(runId: str) -> Response:
        _host()
        return json_response(runs.body(await runs.heartbeat(runId)))

    @app.post(paths.route(paths.HOST_CLOSE))
    async def host_close(runId: str) -> Response:
        _host()
        run, _active = await runs.close(runId)
        return json_response(runs.body(run))

    @app.post(paths.route(paths.HOST_TASKS))
    async def host_adopt_task(runId: str) -> Response:
        _host()
        req = _decode(AdoptTaskRequest, await _body(MAX_CLAIM_BODY))
        return json_response(await runs.adopt_task(runId, req.server, req.handle()))

    @app.post(paths.route(paths.HOST_FINALIZE))
    async def host_finalize(runId: str) -> Response:
        _host()
        req = _decode(FinalizeRequest, await _body(MAX_FINALIZE_BODY))
        history = [{"role": m.role, "content": m.content} for m in req.history]
        try:
            run = await runs.finalize(runId, history)
        except (BlobQuotaExceeded, BlobTooLarge):
            raise RequestTooLarge("the origin snapshot does not fit the snapshot store's quota") from None
        return json_response(runs.body(run))

    @app.post(paths.route(paths.HOST_ACTIVATE))
    async def host_activate(runId: str) -> Response:
        _host()
        return json_response(runs.body(await runs.activate(runId)))

    @app.post(paths.route(paths.HOST_ABANDON))
    async def host_abandon(runId: str) -> Response:
        _host()
        return json_response(runs.body(await runs.abandon(runId)))

    # -- the app handle's continuation operations ---------------------------------------------
    @app.get(paths.HOST_HEALTH)
    async def host_health() -> Response:
        _host()
        return json_response(service.continuation_health())

    @app.get(paths.HOST_LIST)
    async def host_list() -> Response:
        _host()
        limit = query_int("limit")
        return json_response(service.list_continuations(limit=limit, cursor=request.args.get("cursor")))

    @app.get(paths.route(paths.HOST_CAPTURED_TEXT))
    async def host_captured_text(cid: str) -> Response:
        _host()
        text = service.captured_continuation_text(cid)
        return json_response(CapturedTextBody(continuation_id=cid, text=text))

    @app.post(paths.route(paths.HOST_RETRY))
    async def host_retry(cid: str) -> Response:
        _host()
        return await verbs.retry(service, cid)

    @app.post(paths.route(paths.HOST_CANCEL))
    async def host_cancel(cid: str) -> Response:
        _host()
        return await verbs.cancel(service, cid)

    @app.post(paths.route(paths.HOST_RESOLVE))
    async def host_resolve(cid: str) -> Response:
        _host()
        return await verbs.resolve(service, cid)

    @app.post(paths.route(paths.HOST_TASK_OUTCOME))
    async def host_task_outcome(cid: str) -> Response:
        _host()
        outcome = _decode(TaskOutcome, await _body(MAX_TASK_OUTCOME_BODY))
        return json_response(await service.report_task_outcome(cid, outcome, host_only=True))

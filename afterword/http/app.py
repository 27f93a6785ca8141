"""The Quart app: decode, call the service, encode. No protocol rules live here."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException, RequestHeaderFieldsTooLarge

from ..app.service import ContinuationService
from ..continuations.errors import ContinuationError, InvalidRequest
from ..continuations.rules import MAX_RESULT_BODY
from ..disk import DiskError
from ..protocol import paths
from ..protocol.wire import LivezBody
from . import producer
from . import verb_routes as verbs
from .messages import QUART_REQUEST, answer, json_response, query_int
from .messages import bearer as _bearer
from .messages import decode_json as decode_json
from .openapi import openapi_bytes
from .ui import install_ui
from .wirebody import STORAGE_RETRY_AFTER_S as STORAGE_RETRY_AFTER_S
from .wirebody import domain_error, http_error, storage_error, unexpected_error

log = logging.getLogger("afterword.http")


def allowed_hosts(host: str, port: int) -> frozenset[str]:
    """The Host header values a loopback service answers to: the loopback names of the family
    it listens on, with or without its port. Anything else is a DNS-rebinding attempt (a
    browser page whose name now resolves to 127.0.0.1) or a misdirected request."""
    names = {host.lower()}
    if ":" in host:
        names = {f"[{host}]", "[::1]"}
    else:
        names |= {"localhost", "127.0.0.1"}
    return frozenset(names | {f"{name}:{port}" for name in names})


# Quart's own cap on any body (the routes' limits are lower); past it Quart answers 413.
MAX_CONTENT_LENGTH = MAX_RESULT_BODY + 4096
# The request line and headers together. h11 enforces this only on a head that arrives over
# several reads; one that fits a single 64 KiB read is checked here.
MAX_REQUEST_HEAD = 16 * 1024


def request_head_size(scope: Mapping[str, Any]) -> int:
    """Bytes of the request line and headers as sent (ASGI scope), separators included."""
    target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 1
    line = len(str(scope.get("method", ""))) + target + len(" HTTP/1.1\r\n") + 1
    return line + sum(len(k) + len(v) + 4 for k, v in scope.get("headers") or ())


def origin_form(scope: Mapping[str, Any]) -> bool:
    """Whether the request line's target is a path, as a client sends to the server it talks
    to. An absolute URL (``GET http://evil.com/v1/...``) is what a proxy receives: answering
    it would let the authority in the line disagree with the Host header that was checked,
    so it is refused. The ASGI server passes the target through as ``raw_path``."""
    target = scope.get("raw_path")
    if target is None:  # an ASGI server may leave it out; then the path is all there is
        target = str(scope.get("path", "")).encode()
    return bytes(target).startswith(b"/")


def create_app(service: ContinuationService) -> Quart:
    """Build the HTTP facade for ``service`` (served on loopback only by ``serve``)."""
    app = Quart("afterword.http", root_path=os.path.dirname(os.path.abspath(__file__)))
    app.config["MAX_CONTENT_LENGTH"] = MAX_CONTENT_LENGTH
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    # A request body must arrive in full within this long of the handler asking for it.
    app.config["BODY_TIMEOUT"] = service.config.limits.body_timeout_ms / 1000
    hosts = allowed_hosts(service.config.host, service.config.port)

    @app.before_request
    async def _check_host() -> None:
        scope = cast(Mapping[str, Any], request.scope)
        if request_head_size(scope) > MAX_REQUEST_HEAD:
            raise RequestHeaderFieldsTooLarge()
        if not origin_form(scope):
            raise InvalidRequest("the request target must be a path (origin-form), not a URL or '*'")
        host = request.headers.get("Host", "").strip().lower()
        if host not in hosts:
            raise InvalidRequest("the Host header does not name this loopback service")

    @app.errorhandler(ContinuationError)
    async def _domain_error(exc: ContinuationError) -> Response:
        return answer(domain_error(exc))

    # Every disk-layer failure, the first one included: a state directory found moved or a
    # live file replaced raises UnsafeStateError (and fails the root) before any later request
    # meets DiskFailedError, and both are the same outage to a client.
    @app.errorhandler(DiskError)
    async def _storage_error(exc: DiskError) -> Response:
        return answer(storage_error(exc, service, request.method))

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        return answer(http_error(exc))

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        rule = request.url_rule.rule if request.url_rule is not None else "?"
        return answer(unexpected_error(exc, request.method, rule))

    @app.get(paths.LIVEZ)
    async def livez() -> Response:
        # Unauthenticated on purpose: it answers that the process serves HTTP and nothing more
        # (no counts, no version, no state), so a probe needs no capability.
        return json_response(LivezBody(status="up"))

    # The hot producer routes: their work is in producer.py, shared with the ASGI fast path.
    @app.post(paths.CLAIM)
    async def claim() -> Response:
        return json_response(await producer.claim(service, QUART_REQUEST))

    @app.post(paths.DETACHED_CLAIM)
    async def detached_claim() -> Response:
        return json_response(await producer.detached_claim(service, QUART_REQUEST))

    @app.route(paths.route(paths.RESULT), methods=["PUT", "POST"])
    async def result(cid: str) -> Response:
        return json_response(await producer.result(service, QUART_REQUEST, cid))

    @app.get(paths.route(paths.STATUS))
    async def status(cid: str) -> Response:
        return json_response(producer.status(service, QUART_REQUEST, cid))

    # -- operator API (authenticated by the restart-stable operator capability) ----------------
    def _operator() -> None:
        service.verify_operator(_bearer())

    @app.get(paths.LIST)
    async def op_list() -> Response:
        _operator()
        limit = query_int("limit")
        order = request.args.get("order", "oldest")
        if order not in ("oldest", "newest"):
            raise InvalidRequest("order must be oldest or newest")
        return json_response(
            service.list_continuations(
                limit=limit,
                cursor=request.args.get("cursor"),
                state=request.args.get("state"),
                server=request.args.get("server"),
                route=request.args.get("route"),
                newest_first=order == "newest",
            )
        )

    @app.get(paths.route(paths.SHOW))
    async def op_show(cid: str) -> Response:
        _operator()
        return json_response(service.continuation_detail(cid))

    @app.get(paths.HEALTH)
    async def op_health() -> Response:
        _operator()
        return json_response(service.continuation_health())

    @app.post(paths.route(paths.RETRY))
    async def op_retry(cid: str) -> Response:
        _operator()
        return await verbs.retry(service, cid)

    @app.post(paths.route(paths.CANCEL))
    async def op_cancel(cid: str) -> Response:
        _operator()
        return await verbs.cancel(service, cid)

    @app.post(paths.route(paths.ACKNOWLEDGE))
    async def op_acknowledge(cid: str) -> Response:
        _operator()
        return json_response(await service.acknowledge_continuation(cid))

    @app.post(paths.route(paths.RESOLVE))
    async def op_resolve(cid: str) -> Response:
        _operator()
        return await verbs.resolve(service, cid)

    @app.get(paths.METRICS)
    async def op_metrics() -> Response:
        service.verify_metrics_reader(_bearer())
        from .metrics import render_metrics

        return Response(render_metrics(service), status=200, content_type="text/plain; version=0.0.4")

    # The status page under /ui (afterword/http/ui); its one-time login links come from here.
    page = install_ui(app, service)

    @app.post(paths.UI_LOGIN)
    async def op_ui_login() -> Response:
        _operator()
        return json_response(page.login())

    from .hostapi import add_host_routes  # it uses this module's helpers

    add_host_routes(app, service)
    document = openapi_bytes()

    @app.get(paths.OPENAPI)
    async def openapi() -> Response:
        return Response(document, status=200, content_type="application/json")

    return app


Handler = Callable[..., Awaitable[Response]]

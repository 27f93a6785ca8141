"""The status page's routes: server-rendered HTML under ``/ui`` (readable with JavaScript off).

Every page needs a session (see :mod:`.auth`); every POST also needs the session's CSRF token
and, when the browser says where it comes from, this service's own origin. Responses carry a
strict Content-Security-Policy: scripts, styles and images only from ``/ui/static``, no
inline script or style, no framing, forms posting only here.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from quart import Blueprint, Response, redirect, render_template, request, url_for
from werkzeug.exceptions import RequestEntityTooLarge

from ...app.service import ContinuationService
from ...continuations.errors import ContinuationError, Forbidden, InvalidRequest, NotFound, RequestTooLarge
from ...continuations.model import STATES
from ...continuations.rules import format_ms
from .activity import ActivityRing
from .auth import Session, UiAuth
from .chart import BAR_W, HEIGHT, WIDTH, chart_rows
from .verbs import UNSAFE_RETRY_WARNING, VERBS, verbs_for

UI_PAGE_SIZE = 50
FORM_LIMIT = 4096
MAX_FILTER = 256
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: with it Chromium sends "Origin: null" on form posts, and the Origin
    # check below needs the real one. No page URL carries a secret anyway.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


class NotSignedIn(ContinuationError):
    status = 401
    code = "unauthorized"


def _filters() -> dict[str, str]:
    """The list filters from the query (empty values dropped, lengths bounded)."""
    out: dict[str, str] = {}
    for name in ("state", "server", "route"):
        value = request.args.get(name, "").strip()
        if not value:
            continue
        if len(value) > MAX_FILTER:
            raise InvalidRequest(f"{name} is longer than {MAX_FILTER} characters")
        out[name] = value
    if "state" in out and out["state"] not in STATES:
        raise InvalidRequest("state must be one of " + ", ".join(STATES))
    return out


def build_blueprint(service: ContinuationService, auth: UiAuth, ring: ActivityRing) -> Blueprint:
    bp = Blueprint("ui", __name__, url_prefix="/ui", template_folder="templates", static_folder="static")
    origins = {service.base_url, f"http://localhost:{service.config.port}"}
    cookie = auth.cookie  # this state directory's own name (auth.cookie_name)

    def session() -> tuple[str, Session]:
        sid = request.cookies.get(cookie)
        found = auth.session(sid)
        if sid is None or found is None:
            raise NotSignedIn("sign in with a login link from `afterword continuations ui`")
        return sid, found

    def check_post(found: Session, form: Any) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and origin not in origins:
            raise Forbidden("this form was not sent from the status page")
        if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            raise Forbidden("this form was not sent from the status page")
        if not auth.csrf_ok(found, form.get("csrf")):
            raise Forbidden("the form's CSRF token is missing or stale: reload the page and try again")

    async def page(template: str, status: int = 200, **context: Any) -> Response:
        health = service.continuation_health()
        html = await render_template(
            template, health=health, config_path=service.config.config_path, **context
        )
        return Response(html, status=status, content_type="text/html; charset=utf-8")

    # App-wide, not the blueprint's own hook: a request under /ui that matches no route (a
    # 404, 405 or the /ui -> /ui/ redirect) never reaches the blueprint, and its answer needs
    # the same policy.
    @bp.after_app_request
    async def _headers(response: Response) -> Response:
        if request.path == "/ui" or request.path.startswith("/ui/"):
            for name, value in HEADERS.items():
                response.headers[name] = value
        return response

    @bp.errorhandler(ContinuationError)
    async def _error(exc: ContinuationError) -> Response:
        signed_in = auth.session(request.cookies.get(cookie)) is not None
        html = await render_template(
            "error.html",
            status=exc.status,
            message=str(exc),
            signed_in=signed_in,
            back=(request.view_args or {}).get("cid"),
        )
        return Response(html, status=exc.status, content_type="text/html; charset=utf-8")

    @bp.get("/login")
    async def login() -> Response:
        redeemed = auth.redeem(request.args.get("token", ""))
        if redeemed is None:
            raise NotSignedIn(
                "this login link has expired or was already used: run `afterword continuations ui` for a new one"
            )
        sid, found = redeemed
        # A page that moves on by itself, not a redirect. A link opened from anywhere else
        # (the forwarding file of `ui --open`, a chat, a mail) starts a cross-site navigation,
        # and browsers withhold a SameSite=Strict cookie from every redirect within it; the
        # refresh is a new navigation started by this page, so the cookie goes along.
        response = Response(
            await render_template("signed-in.html"), status=200, content_type="text/html; charset=utf-8"
        )
        response.set_cookie(
            cookie,
            sid,
            max_age=max(1, (found.expires_at_ms - service.clock_ms()) // 1000),
            path="/ui",
            httponly=True,
            samesite="Strict",
        )
        return response

    @bp.post("/logout")
    async def logout() -> Response:
        sid, found = session()
        check_post(found, await _form())
        auth.end(sid)
        response = redirect(url_for("ui.signed_out"), 303)
        response.delete_cookie(cookie, path="/ui", httponly=True, samesite="Strict")
        return response  # type: ignore[return-value]

    @bp.get("/signed-out")
    async def signed_out() -> Response:
        html = await render_template(
            "error.html", status=200, message="Signed out.", signed_in=False, back=None
        )
        return Response(html, status=200, content_type="text/html; charset=utf-8")

    @bp.get("/")
    async def index() -> Response:
        _, found = session()
        filters = _filters()
        cursor = request.args.get("cursor") or None
        listing = service.list_continuations(
            limit=min(UI_PAGE_SIZE, service.config.limits.operator_page_size),
            cursor=cursor,
            state=filters.get("state"),
            server=filters.get("server"),
            route=filters.get("route"),
            newest_first=True,
        )
        next_url = None
        if listing.next_cursor:
            next_url = url_for("ui.index") + "?" + urlencode({**filters, "cursor": listing.next_cursor})
        summary = ring.summary()
        cfg = service.config
        return await page(
            "index.html",
            csrf=found.csrf,
            listing=listing,
            filters=filters,
            next_url=next_url,
            paged=cursor is not None,
            states=STATES,
            servers=sorted({*cfg.continuation_servers, *cfg.detached_services}),
            routes=sorted(cfg.named_routes),
            summary=summary,
            since=format_ms(summary.since_ms),
            rows=chart_rows(summary),
            chart_w=WIDTH,
            chart_h=HEIGHT,
            bar_w=BAR_W,
        )

    @bp.get("/c/<cid>")
    async def detail(cid: str) -> Response:
        _, found = session()
        body = service.continuation_detail(cid)
        done = VERBS.get(request.args.get("done", ""))
        return await page("detail.html", csrf=found.csrf, d=body, verbs=verbs_for(body.status), done=done)

    @bp.get("/c/<cid>/confirm/<verb>")
    async def confirm(cid: str, verb: str) -> Response:
        _, found = session()
        if verb not in VERBS:
            raise NotFound(f"no verb {verb}")
        body = service.continuation_detail(cid)
        return await page(
            "confirm.html", csrf=found.csrf, d=body, verb=VERBS[verb], warning=UNSAFE_RETRY_WARNING
        )

    async def _form() -> Any:
        if (request.content_length or 0) > FORM_LIMIT:
            raise RequestTooLarge(f"a form may be at most {FORM_LIMIT} bytes")
        try:
            return await request.form
        except RequestEntityTooLarge:  # a chunked body past the request's cap (see hostapi)
            raise RequestTooLarge(f"a form may be at most {FORM_LIMIT} bytes") from None

    @bp.post("/c/<cid>/<verb>")
    async def act(cid: str, verb: str) -> Response:
        _, found = session()  # from the cookie, before a byte of the body is read
        if verb not in VERBS:
            raise NotFound(f"no verb {verb}")
        form = await _form()
        check_post(found, form)
        await _apply(service, cid, verb, form)
        return redirect(url_for("ui.detail", cid=cid, done=verb), 303)  # type: ignore[return-value]

    return bp


async def _apply(service: ContinuationService, cid: str, verb: str, form: Any) -> None:
    if verb == "retry":
        await service.retry_continuation(cid)
    elif verb == "retry-unknown":
        if form.get("verified") != "yes":
            raise InvalidRequest("tick the box that you verified a second post cannot duplicate a message")
        await service.retry_continuation(cid, allow_unknown=True)
    elif verb == "cancel":
        await service.cancel_continuation(cid)
    elif verb == "acknowledge":
        await service.acknowledge_continuation(cid)
    elif verb == "resolve-delivered":
        delivery_id = (form.get("delivery_id") or "").strip()
        if not delivery_id or len(delivery_id) > MAX_FILTER:
            raise InvalidRequest("resolving as delivered needs the delivery id you found in the channel")
        await service.resolve_continuation_delivery(cid, {"kind": "delivered", "delivery_id": delivery_id})
    else:
        kind = "not_delivered" if verb == "resolve-not-delivered" else "dead_lettered"
        await service.resolve_continuation_delivery(cid, {"kind": kind})

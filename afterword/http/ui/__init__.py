"""The operator status page served by ``afterword serve`` under ``/ui`` (docs/operating.md).

:func:`install_ui` adds the page's blueprint to the HTTP app and returns the
:class:`StatusPage` whose :meth:`~StatusPage.login` the operator API's
``POST /v1/operator/ui/login`` answers with. The login state and the activity ring belong to
the service (one per service, however many apps are built over it) and live in memory only.
"""

from __future__ import annotations

import weakref

from quart import Quart

from ...app.service import ContinuationService
from ...continuations.rules import format_ms
from ...protocol.wire import UiLoginBody
from .activity import ActivityRing
from .auth import UiAuth, cookie_name
from .routes import build_blueprint

__all__ = ["StatusPage", "install_ui"]


class StatusPage:
    def __init__(self, service: ContinuationService) -> None:
        # No reference to the service itself: it is the key of the weak map below.
        self.base_url = service.base_url
        self.auth = UiAuth(service.clock_ms, cookie=cookie_name(service.status_page_key()))
        self.activity = ActivityRing(service.clock_ms)
        service.on_change.append(self.activity.observe)

    def __repr__(self) -> str:
        return f"<StatusPage {self.auth!r} {self.activity!r}>"

    def login(self) -> UiLoginBody:
        token, expires = self.auth.mint_login()
        return UiLoginBody(login_url=f"{self.base_url}/ui/login?token={token}", expires_at=format_ms(expires))


_pages: weakref.WeakKeyDictionary[ContinuationService, StatusPage] = weakref.WeakKeyDictionary()


def status_page(service: ContinuationService) -> StatusPage:
    page = _pages.get(service)
    if page is None:
        page = _pages[service] = StatusPage(service)
    return page


def install_ui(app: Quart, service: ContinuationService) -> StatusPage:
    page = status_page(service)
    app.register_blueprint(build_blueprint(service, page.auth, page.activity))
    return page

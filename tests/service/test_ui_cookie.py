"""Two services on one machine, one browser: the status page's session cookies must not
collide. Browsers keep one cookie jar per host name, whatever the port (so does httpx's jar,
which stands in for the browser here), so with one shared cookie name every sign-in to one
service signed the browser out of the other."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import httpx
import pytest
from _ui import NeverConfirms, mint_login
from fakes import Clock
from fakes.harness import make_config, running

from afterword.clients.operator import _read_secret
from afterword.http.ui import status_page
from afterword.http.ui.auth import COOKIE, cookie_name
from afterword.store.keys import STATUS_PAGE, derive_key

pytestmark = pytest.mark.anyio


def session_of(client: httpx.AsyncClient, name: str) -> str:
    (value,) = [c.value for c in client.cookies.jar if c.name == name]
    assert value is not None
    return value


async def test_two_services_on_loopback_keep_their_own_sessions(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    config_a, env_a = make_config(tmp_path / "a")
    config_b, env_b = make_config(tmp_path / "b")
    assert config_a.port != config_b.port
    channels = {"*": NeverConfirms()}
    async with (
        running(config_a, env_a, channels=channels, clock=Clock()) as a,
        running(config_b, env_b, channels=channels, clock=Clock()) as b,
        httpx.AsyncClient(trust_env=False) as browser,
    ):
        name_a, name_b = status_page(a.service).auth.cookie, status_page(b.service).auth.cookie
        # One jar, as in a browser: sign in to A, then to B.
        for svc in (a.service, b.service):
            assert (await browser.get(await mint_login(browser, svc))).status_code == 200
        assert {c.domain for c in browser.cookies.jar} == {"127.0.0.1"}  # not separated by port
        # Both sessions live side by side: signing in to B did not sign the browser out of A.
        for svc in (a.service, b.service):
            page = await browser.get(svc.base_url + "/ui/")
            assert page.status_code == 200 and "sign out" in page.text
        assert name_a != name_b and name_a.startswith(COOKIE + "_") and name_b.startswith(COOKIE + "_")
        # A cookie minted by A is refused by B, under either name.
        sid_a = session_of(browser, name_a)
        for name in (name_a, name_b):
            stray = await browser.get(b.service.base_url + "/ui/", headers={"Cookie": f"{name}={sid_a}"})
            assert stray.status_code == 401
        # Signing out of B leaves A's session alone.
        page = await browser.get(b.service.base_url + "/ui/")
        csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
        out = await browser.post(b.service.base_url + "/ui/logout", data={"csrf": csrf})
        assert out.status_code == 303
        assert (await browser.get(b.service.base_url + "/ui/")).status_code == 401
        assert (await browser.get(a.service.base_url + "/ui/")).status_code == 200


async def test_the_cookie_name_is_the_state_directorys_own(tmp_path: Path) -> None:
    config, env = make_config(tmp_path)
    async with running(config, env, channels={"*": NeverConfirms()}, clock=Clock()) as h:
        name = status_page(h.service).auth.cookie
        key = h.service._keys.status_page
        tag = hmac.new(key, b"session-cookie-name", hashlib.sha256).hexdigest()[:16]
        assert name == f"{COOKIE}_{tag}" == cookie_name(key)
        # its own key, independent of every capability's
        assert key == derive_key(_read_secret(config), STATUS_PAGE)
        assert key not in {h.service._keys.operator, h.service._keys.host, h.service._keys.metrics}
        assert key.hex()[:16] not in name  # a tag, not the key
    # The same state directory gives the same name after a restart (sessions themselves do not
    # survive it), so a new sign-in replaces the old cookie instead of adding one.
    async with running(config, env, channels={"*": NeverConfirms()}, clock=Clock()) as h:
        assert status_page(h.service).auth.cookie == name

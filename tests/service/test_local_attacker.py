"""What another local user, a rebinding web page or a buggy host found in the host API and
the status page, each pinned by the attack that found it (docs/http-hardening.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from _ui import sign_in
from test_http_protocol import CONV, REPLY, assert_error, auth, serving

from afterword.clients.operator import read_host_token
from afterword.http.ui.routes import CSP, FORM_LIMIT

pytestmark = pytest.mark.anyio


async def test_unrouted_answers_under_ui_carry_the_page_policy(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        base = h.service.base_url
        for method, path in (
            ("GET", "/ui/no-such-page"),  # 404 from the router, not from a /ui view
            ("GET", "/ui/logout"),  # 405
            ("DELETE", "/ui/"),  # 405
            ("GET", "/ui"),  # the redirect to /ui/
        ):
            r = await h.client.request(method, base + path)
            assert r.status_code in (308, 404, 405), (path, r.status_code)
            assert r.headers.get("content-security-policy") == CSP, (method, path)
            assert r.headers.get("x-content-type-options") == "nosniff", (method, path)
            assert r.headers.get("cache-control") == "no-store", (method, path)
            assert r.headers.get("x-frame-options") == "DENY", (method, path)
        # ...and the JSON API keeps its own answers (the policy is the page's).
        r = await h.client.get(base + "/v1/no-such-route")
        assert r.status_code == 404 and "content-security-policy" not in r.headers


async def test_a_run_id_no_url_can_address_is_refused_at_begin(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        base = h.service.base_url + "/v1/host/runs"
        host = auth(read_host_token(h.config))
        for run_id in ("a/b", "/", "..", "."):
            resp = await h.client.post(
                base, headers=host, json={"runId": run_id, "conversationId": CONV, "replyTo": REPLY}
            )
            assert_error(resp, 400, "invalid_request")
            assert "runId" in resp.json()["error"]["message"]
        # Ids that look odd but fit one path segment still work end to end.
        for run_id, segment in (("a.b", "a.b"), ("é✓", "%C3%A9%E2%9C%93"), ("a%2Fb", "a%252Fb")):
            resp = await h.client.post(
                base, headers=host, json={"runId": run_id, "conversationId": CONV, "replyTo": REPLY}
            )
            assert resp.status_code == 200, resp.text
            got = await h.client.post(f"{base}/{segment}/heartbeat", headers=host)
            assert got.status_code == 200 and got.json()["runId"] == run_id, got.text


async def test_a_chunked_form_is_held_to_the_form_limit_too(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        ui = await sign_in(h.client, h.service)
        csrf = await ui.csrf()
        headers = {"Cookie": ui.cookie, "Content-Type": "application/x-www-form-urlencoded"}

        async def chunked(body: bytes) -> AsyncIterator[bytes]:
            yield body  # no Content-Length: the route cannot refuse from the headers

        big = f"csrf={csrf}&pad=".encode() + b"a" * (FORM_LIMIT * 25)
        url = h.service.base_url + "/ui/c/c_nope/cancel"
        r = await h.client.post(url, headers=headers, content=chunked(big))
        assert r.status_code == 413, r.text
        assert r.headers["content-security-policy"] == CSP
        # the same form within the limit is read (and reaches the verb: no such continuation)
        r = await h.client.post(url, headers=headers, content=chunked(f"csrf={csrf}".encode()))
        assert r.status_code == 404, r.text

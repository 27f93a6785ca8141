"""The operator status page over plain HTTP (issue 18): one-time login links, session cookies,
CSRF and Origin checks, the Host check, the Content-Security-Policy and what the pages show
(never captured text, never a token), the verbs, and the list's filters and keyset paging."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from _service import DETACHED_TOKEN, deadline, payload_hash
from _ui import NeverConfirms, audit, mint_login, operator_headers, sign_in
from fakes import Clock
from fakes.harness import make_config, running
from fakes.producer import wait_state

from afterword import ContinuationService
from afterword.continuations.capabilities import result_token
from afterword.http.ui import status_page
from afterword.http.ui.auth import LOGIN_TTL_MS, SESSION_TTL_MS
from afterword.http.ui.routes import CSP
from afterword.protocol.wire import DetachedClaimRequest

pytestmark = pytest.mark.anyio
SECRET_TEXT = "CAPTURED-ANSWER-7f3a"
SECRET_PAYLOAD = "PAYLOAD-ONLY-91bc"


async def detached(
    svc: ContinuationService, client: httpx.AsyncClient, route: str, task: str, payload: Any = None
) -> str:
    claim = await svc.detached_claim(
        "work-control",
        DETACHED_TOKEN,
        DetachedClaimRequest(route=route, task_key=task, task_hash="h-" + task, deadline=deadline()),
    )
    if payload is not None:
        r = await client.put(
            claim.result_url,
            headers={"Authorization": f"Bearer {claim.result_token}"},
            json={"idempotencyKey": "k-" + task, "payloadHash": payload_hash(payload), "payload": payload},
        )
        assert r.status_code == 200, r.text
    return claim.continuation_id


def world(tmp_path: Path, clock: Clock | None = None) -> Any:
    config, env = make_config(tmp_path)
    return running(config, env, channels={"*": NeverConfirms()}, clock=clock or Clock())


async def test_a_login_link_works_once_and_sets_a_strict_httponly_cookie(tmp_path: Path) -> None:
    async with world(tmp_path) as h, httpx.AsyncClient(trust_env=False) as client:
        svc = h.service
        url = await mint_login(client, svc)
        first = await client.get(url)
        # A page that moves on to /ui/ by itself (a meta refresh, no script), not a redirect:
        # a browser withholds a Strict cookie from redirects of a navigation begun elsewhere.
        assert first.status_code == 200 and "location" not in first.headers
        assert '<meta http-equiv="refresh" content="0;url=/ui/">' in first.text
        assert url.split("token=")[1] not in first.text
        cookie = first.headers["set-cookie"]
        flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "max-age", "path"} <= flags
        assert re.search(r"(?i)samesite=strict", cookie) and re.search(r"(?i)path=/ui\b", cookie)
        session = cookie.split(";", 1)[0]
        # the session id is neither the login token nor the operator capability
        assert url.split("token=")[1] not in session and svc.operator_token() not in cookie
        page = await client.get(svc.base_url + "/ui/", headers={"Cookie": session})
        assert page.status_code == 200 and "Health" in page.text
        again = await client.get(url)  # spent
        assert again.status_code == 401 and "set-cookie" not in again.headers
        assert "afterword continuations ui" in again.text
        assert again.headers["content-type"].startswith("text/html")
        # a wrong or missing token is refused the same way
        for bad in ("/ui/login", "/ui/login?token=", "/ui/login?token=nope"):
            r = await client.get(svc.base_url + bad)
            assert r.status_code == 401 and "set-cookie" not in r.headers


async def test_login_links_expire_and_sessions_expire(tmp_path: Path) -> None:
    clock = Clock()
    async with world(tmp_path, clock) as h, httpx.AsyncClient(trust_env=False) as client:
        svc = h.service
        stale = await mint_login(client, svc)
        clock.advance(LOGIN_TTL_MS + 1)
        assert (await client.get(stale)).status_code == 401
        ui = await sign_in(client, svc)
        assert (await ui.get("/ui/")).status_code == 200
        clock.advance(SESSION_TTL_MS - 1000)
        assert (await ui.get("/ui/")).status_code == 200
        clock.advance(2000)
        expired = await ui.get("/ui/")
        assert expired.status_code == 401 and "afterword continuations ui" in expired.text


async def test_only_the_operator_capability_mints_a_login(tmp_path: Path) -> None:
    async with world(tmp_path) as h, httpx.AsyncClient(trust_env=False) as client:
        svc = h.service
        url = svc.base_url + "/v1/operator/ui/login"
        assert (await client.post(url)).status_code == 401
        metrics = svc._keys.metrics  # the read-only scrape capability opens metrics only
        from afterword.continuations.capabilities import metrics_token

        r = await client.post(url, headers={"Authorization": "Bearer " + metrics_token(metrics)})
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        # and no page answers without a session, nor with a made-up one
        for cookie in (None, status_page(svc).auth.cookie + "=made-up"):
            headers = {"Cookie": cookie} if cookie else {}
            r = await client.get(svc.base_url + "/ui/", headers=headers)
            assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")


async def test_state_changes_need_the_sessions_csrf_token_and_this_origin(tmp_path: Path) -> None:
    async with world(tmp_path) as h, httpx.AsyncClient(trust_env=False) as client:
        svc = h.service
        cid = await detached(svc, client, "daily-attention", "pending-1")
        ui = await sign_in(client, svc)
        other = await sign_in(client, svc)
        token = await ui.csrf(f"/ui/c/{cid}")
        path = f"/ui/c/{cid}/cancel"
        for data, origin in (
            ({}, None),
            ({"csrf": ""}, None),
            ({"csrf": "x" * 43}, None),
            ({"csrf": await other.csrf()}, None),  # another session's token
            ({"csrf": token}, "http://evil.example"),  # a cross-site form
        ):
            r = await ui.post(path, data, origin=origin)
            assert r.status_code == 403, (data, origin, r.text)
            assert svc.repo.get(cid).state == "claimed"  # type: ignore[union-attr]
        # an oversized form, or a verb that does not exist, changes nothing either
        r = await ui.post(path, {"csrf": token, "pad": "x" * 5000})
        assert r.status_code == 413 and svc.repo.get(cid).state == "claimed"  # type: ignore[union-attr]
        assert (await ui.post(f"/ui/c/{cid}/explode", {"csrf": token})).status_code == 404
        # without a session the form is refused before anything else
        r = await client.post(svc.base_url + path, data={"csrf": token})
        assert r.status_code == 401
        ok = await ui.post(path, {"csrf": token}, origin=svc.base_url)
        assert ok.status_code == 303 and ok.headers["location"].endswith(f"/ui/c/{cid}?done=cancel")
        assert svc.repo.get(cid).state == "cancelled"  # type: ignore[union-attr]
        # signing out ends the session for good
        assert (await ui.post("/ui/logout", {"csrf": token})).status_code == 303
        assert (await ui.get("/ui/")).status_code == 401


async def test_the_host_header_must_name_this_loopback_service(tmp_path: Path) -> None:
    async with world(tmp_path) as h, httpx.AsyncClient(trust_env=False) as client:
        svc = h.service
        ui = await sign_in(client, svc)
        port = h.config.port
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.2:{port}", f"[::1]:{port}"):
            r = await client.get(svc.base_url + "/ui/", headers={"Cookie": ui.cookie, "Host": host})
            assert r.status_code == 400, host
            assert host not in r.text
        url = await mint_login(client, svc)
        r = await client.get(url, headers={"Host": "rebound.example"})
        assert r.status_code == 400 and "set-cookie" not in r.headers
        for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
            assert (
                await client.get(svc.base_url + "/ui/", headers={"Cookie": ui.cookie, "Host": host})
            ).status_code == 200


async def test_pages_never_show_captured_text_payloads_or_tokens(tmp_path: Path) -> None:
    async with world(tmp_path) as h, httpx.AsyncClient(trust_env=False) as client:
        svc = h.service
        captured = await detached(svc, client, "verification", "cap-1", {"summary": SECRET_TEXT})
        unknown = await detached(svc, client, "daily-attention", "unk-1", {"summary": SECRET_PAYLOAD})
        pending = await detached(svc, client, "daily-attention", "pend-1")
        await wait_state(svc, captured)
        await wait_state(svc, unknown)
        # the test can fail: the text really is held, and reachable in-process
        assert SECRET_TEXT in (svc.captured_continuation_text(captured) or "")
        ui = await sign_in(client, svc)
        login_url = await mint_login(client, svc)
        secrets = [
            SECRET_TEXT,
            SECRET_PAYLOAD,
            svc.operator_token(),
            DETACHED_TOKEN,
            login_url.split("token=")[1],
            *(result_token(svc._keys.result, c) for c in (captured, unknown, pending)),
        ]
        paths = ["/ui/", "/ui/?state=delivered", "/ui/?route=verification"]
        for cid in (captured, unknown, pending):
            paths.append(f"/ui/c/{cid}")
            for verb in ("retry", "retry-unknown", "cancel", "acknowledge", "resolve-delivered"):
                paths.append(f"/ui/c/{cid}/confirm/{verb}")
        for path in paths:
            r = await ui.get(path)
            assert r.status_code == 200, (path, r.text)
            for secret in secrets:
                assert secret not in r.text, (path, secret[:8])
                assert secret not in str(r.headers), (path, secret[:8])
            assert r.headers["content-security-policy"] == CSP
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["referrer-policy"] == "same-origin"
            assert r.headers["cache-control"] == "no-store"
            found = audit(r.text)
            assert found.problems == [], (path, found.problems)
            assert found.scripts == ["/ui/static/ui.js"]
        detail = (await ui.get(f"/ui/c/{captured}")).text
        assert "captured" in detail and "verification" in detail and "work-control" in detail


async def test_static_files_come_from_the_package_under_the_same_policy(tmp_path: Path) -> None:
    async with world(tmp_path) as h, httpx.AsyncClient(trust_env=False) as client:
        svc = h.service
        for name, kind in (("ui.css", "text/css"), ("ui.js", "javascript")):
            r = await client.get(f"{svc.base_url}/ui/static/{name}")
            assert r.status_code == 200 and kind in r.headers["content-type"]
            assert r.headers["content-security-policy"] == CSP
            assert "http://" not in r.text and "https://" not in r.text and "@import" not in r.text
        js = (await client.get(f"{svc.base_url}/ui/static/ui.js")).text
        assert "localStorage" not in js and "sessionStorage" not in js and "document.cookie" not in js


async def test_resolving_an_unknown_delivery_through_the_page(tmp_path: Path) -> None:
    async with world(tmp_path) as h, httpx.AsyncClient(trust_env=False) as client:
        svc = h.service
        cid = await detached(svc, client, "daily-attention", "unk-2", {"summary": "ok"})
        assert (await wait_state(svc, cid)).state == "delivery_unknown"
        ui = await sign_in(client, svc)
        home = await ui.get("/ui/")
        assert 'id="health-status">unhealthy<' in home.text and f"/ui/c/{cid}" in home.text
        detail = await ui.get(f"/ui/c/{cid}")
        offered = set(re.findall(r'data-verb="([a-z-]+)"', detail.text))
        # a plain retry is not offered for an unproven post; allow-unknown is its own control
        assert offered == {
            "resolve-delivered",
            "resolve-not-delivered",
            "resolve-dead-lettered",
            "retry-unknown",
        }
        for verb in ("retry-unknown", "resolve-not-delivered", "resolve-delivered"):
            page = await ui.get(f"/ui/c/{cid}/confirm/{verb}")
            assert 'id="unsafe-warning"' in page.text and "twice" in page.text
        token = await ui.csrf(f"/ui/c/{cid}")
        # the unsafe retry needs its own explicit tick, besides the CSRF token
        r = await ui.post(f"/ui/c/{cid}/retry-unknown", {"csrf": token})
        assert r.status_code == 400 and svc.repo.get(cid).state == "delivery_unknown"  # type: ignore[union-attr]
        # a plain retry sent by hand is refused by the service, shown as a page
        r = await ui.post(f"/ui/c/{cid}/retry", {"csrf": token})
        assert r.status_code == 409 and r.headers["content-type"].startswith("text/html")
        # resolving as delivered needs the delivery id
        r = await ui.post(f"/ui/c/{cid}/resolve-delivered", {"csrf": token, "delivery_id": " "})
        assert r.status_code == 400
        r = await ui.post(f"/ui/c/{cid}/resolve-delivered", {"csrf": token, "delivery_id": "msg-42"})
        assert r.status_code == 303
        after = await ui.get(r.headers["location"].removeprefix(svc.base_url))
        assert 'id="state">delivered<' in after.text and "msg-42" in after.text
        assert "Resolved as delivered." in after.text
        assert 'id="health-status">healthy<' in (await ui.get("/ui/")).text
        assert svc.repo.get(cid).receipt.delivery_ids == ("msg-42",)  # type: ignore[union-attr]


async def test_the_list_filters_and_pages_newest_first(tmp_path: Path) -> None:
    clock = Clock()
    async with world(tmp_path, clock) as h, httpx.AsyncClient(trust_env=False) as client:
        svc = h.service
        ids = []
        for i in range(7):
            clock.advance(10)  # distinct creation times
            ids.append(
                await detached(svc, client, "background-index" if i % 2 else "daily-attention", f"t-{i}")
            )
        ui = await sign_in(client, svc)
        # the API: filters, order and the same keyset cursor
        api = svc.base_url + "/v1/operator/continuations"
        headers = operator_headers(svc)
        seen: list[str] = []
        cursor = None
        while True:
            params = {"limit": "2", "order": "newest", "route": "daily-attention"}
            if cursor:
                params["cursor"] = cursor
            body = (await client.get(api, params=params, headers=headers)).json()
            seen += [i["continuationId"] for i in body["items"]]
            assert all(i["route"] == "daily-attention" for i in body["items"])
            cursor = body["nextCursor"]
            if cursor is None:
                break
        assert seen == [ids[6], ids[4], ids[2], ids[0]]
        oldest = (await client.get(api, params={"server": "work-control"}, headers=headers)).json()
        assert [i["continuationId"] for i in oldest["items"]] == ids
        nothing = (await client.get(api, params={"server": "other"}, headers=headers)).json()
        assert nothing == {"items": [], "nextCursor": None}
        for bad in ({"state": "nonsense"}, {"order": "sideways"}, {"cursor": "forged.0"}):
            r = await client.get(api, params=bad, headers=headers)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        # the page: the same filters, newest first
        page = await ui.get("/ui/?route=background-index&state=claimed")
        listed = re.findall(r'<tr class="item" data-id="([^"]+)"', page.text)
        assert listed == [ids[5], ids[3], ids[1]]
        assert (await ui.get("/ui/?state=nonsense")).status_code == 400

"""The status page in a real headless Chromium (issue 18), against `afterword serve` as a
subprocess: log in through the one-time link from `afterword continuations ui`, read health
and the list, page through 150 records, open a detail view, resolve a `delivery_unknown`
through the page and watch health change; the same reading with JavaScript off.

Needs Debian's chromium at /usr/bin/chromium (`.ci/run` installs it) and Playwright for
Python (the `test` extra), which drives that browser: no browser is downloaded. Without them
the tests skip locally and FAIL in CI (CI=true), so they cannot silently not run there.
Screenshots go to the test's directory, and also to $AFTERWORD_UI_SCREENSHOTS when set
(docs/operator-ui.png is one of them).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from _cli import FakeWebhook, Server, cli, served, write_operator_config
from _service import load

from afterword.cli.loginpage import login_page
from afterword.clients.operator import read_operator_token
from afterword.disk.scratch import private_scratch_file, remove_private_scratch

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SECRET_TEXT = "CAPTURED-BROWSER-5e1d"
SECRET_PAYLOAD = "PAYLOAD-BROWSER-c0a7"
RECORDS = 150


def _browser_or_skip() -> Any:
    problem = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = "Playwright for Python is not installed (pip install -e '.[test]')"
    if problem is None and not os.access(CHROMIUM, os.X_OK):
        problem = f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does this)"
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests cannot run in CI: {problem}")
        pytest.skip(problem)
    return sync_playwright


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, Any]]]:
    """One running service with 150+ records: mostly claimed, one captured answer, one
    delivered silently, one whose delivery hung (delivery_unknown)."""
    _browser_or_skip()
    root = tmp_path_factory.mktemp("ui-browser")
    hook = FakeWebhook(hang_s=3.0)
    config = write_operator_config(root, hook.url, limits={"deliveryTimeoutMs": 500})
    try:
        with served(config) as server:
            # concurrently: the WAL's group commit makes one fsync cover many claims
            with ThreadPoolExecutor(max_workers=16) as pool:
                ids = list(
                    pool.map(
                        lambda i: server.claim("quiet", f"bulk-{i:03d}")["continuationId"], range(RECORDS)
                    )
                )
            captured = server.claim("capture", "captured")
            server.result(captured, {"summary": SECRET_TEXT})
            hung = server.claim("hang", "hung")
            server.result(hung, {"summary": SECRET_PAYLOAD, "actionable": True})
            server.wait_state(captured, "delivered")
            server.wait_state(hung, "delivery_unknown")
            yield server, {"bulk": ids, "captured": captured, "hung": hung["continuationId"], "root": root}
    finally:
        hook.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the module (each test opens its own fresh contexts)."""
    pw = _browser_or_skip()().start()
    try:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()
    finally:
        pw.stop()


def login_url(server: Server) -> str:
    code, out, err = cli(server, "continuations", "ui")
    assert code == 0, err
    assert "valid once" in err
    (url,) = out.split()
    assert url.startswith(server.base + "/ui/login?token=")
    return url


def oldest_first(server: Server) -> list[str]:
    """Every id in the API's default order (oldest first), through its own cursor."""
    headers = {"Authorization": "Bearer " + read_operator_token(load(server.config))}
    ids: list[str] = []
    params: dict[str, str] = {}
    while True:
        body = server.http.get(
            server.base + "/v1/operator/continuations", params=params, headers=headers
        ).json()
        ids += [i["continuationId"] for i in body["items"]]
        if body["nextCursor"] is None:
            return ids
        params = {"cursor": body["nextCursor"]}


def shoot(page: Any, root: Path, name: str) -> None:
    path = root / name
    page.screenshot(path=str(path), full_page=False)
    target = os.environ.get("AFTERWORD_UI_SCREENSHOTS")
    if target:
        shutil.copy(path, Path(target) / name)


def test_operator_walks_through_the_page_in_chromium(
    world: tuple[Server, dict[str, Any]], chromium: Any
) -> None:
    server, made = world
    root: Path = made["root"]
    secrets = [
        SECRET_TEXT,
        SECRET_PAYLOAD,
        read_operator_token(load(server.config)),
        made["captured"]["resultToken"],
    ]
    url = login_url(server)
    secrets.append(url.split("token=")[1])
    problems: list[str] = []
    browser = chromium
    context = browser.new_context(viewport={"width": 1400, "height": 1250})
    page = context.new_page()
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith(server.base) else problems.append(r.url))
    seen_html: list[str] = []

    page.goto(url)
    page.wait_for_url(server.base + "/ui/")  # moved on, the token is gone from the bar
    seen_html.append(page.content())
    assert page.locator("#health-status").inner_text() == "unhealthy"
    assert page.locator('.cause[data-code="delivery_unknown"]').count() == 1
    assert page.locator("#live-toggle").is_visible()  # the script ran under the CSP
    # the session lives in an HttpOnly, SameSite=Strict cookie the page cannot read,
    # and nothing is kept in browser storage
    (cookie,) = context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert page.evaluate("document.cookie") == ""
    assert page.evaluate("localStorage.length + sessionStorage.length") == 0
    shoot(page, root, "operator-ui.png")

    # page through every record, newest first, with the keyset cursor
    listed: list[str] = []
    pages = 0
    while True:
        pages += 1
        listed += page.locator("tr.item").evaluate_all("rows => rows.map(r => r.dataset.id)")
        seen_html.append(page.content())
        if page.locator("#next-page").count() == 0:
            break
        page.locator("#next-page").click()
    everything = [*made["bulk"], made["captured"]["continuationId"], made["hung"]]
    assert sorted(listed) == sorted(everything) and len(listed) == len(set(listed))
    assert pages == -(-len(everything) // 50)
    assert listed == list(reversed(oldest_first(server)))  # newest first
    assert page.locator("#last-page").is_visible()

    # filter by route
    page.goto(server.base + "/ui/")
    page.locator("select[name=state]").select_option("delivered")
    page.locator("#filters button[type=submit]").click()
    only = page.locator("tr.item").evaluate_all("rows => rows.map(r => r.dataset.state)")
    assert only == ["delivered"]
    page.goto(server.base + "/ui/?route=capture")
    assert page.locator("tr.item").count() == 1

    # a detail view: binding, history, receipt; never the captured answer
    page.goto(server.base + "/ui/")
    page.locator(f'.cause[data-code="delivery_unknown"] a[href="/ui/c/{made["hung"]}"]').click()
    assert page.locator("#state").inner_text() == "delivery_unknown"
    assert page.locator("#history tbody tr").count() >= 4
    seen_html.append(page.content())
    page.goto(server.base + f"/ui/c/{made['captured']['continuationId']}")
    assert page.locator("#state").inner_text() == "delivered"
    seen_html.append(page.content())
    shoot(page, root, "operator-ui-detail.png")

    # resolve the unknown delivery through the page; health changes
    page.goto(server.base + f"/ui/c/{made['hung']}")
    assert page.locator('[data-verb="retry"]').count() == 0  # only the explicit opt-in
    page.locator('[data-verb="resolve-delivered"]').click()
    assert "twice" in page.locator("#unsafe-warning").inner_text()
    seen_html.append(page.content())
    shoot(page, root, "operator-ui-confirm.png")
    page.locator("#delivery-id").fill("wh-verified-1")
    page.locator("#confirm-button").click()
    assert page.locator("#done").inner_text() == "Resolved as delivered."
    assert page.locator("#state").inner_text() == "delivered"
    assert "wh-verified-1" in page.locator("#delivery-ids").inner_text()
    # no dead letter or unknown delivery left: the 150 claims keep it degraded
    assert page.locator("#health-badge").inner_text() == "degraded"
    page.locator("#health-badge").click()
    assert page.locator('.cause[data-code="delivery_unknown"]').count() == 0
    seen_html.append(page.content())

    for html in seen_html:
        for secret in secrets:
            assert secret not in html, secret[:8]
        assert not re.search(r"<script>|\son[a-z]+=", html)
    assert problems == [], problems


def test_reading_works_with_javascript_off(world: tuple[Server, dict[str, Any]], chromium: Any) -> None:
    server, _ = world
    browser = chromium
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    url = login_url(server)
    page.goto(url)
    page.wait_for_url(server.base + "/ui/")  # the refresh needs no script
    assert page.locator("#health-status").inner_text() in ("unhealthy", "degraded")
    assert page.locator("tr.item").count() == 50
    assert not page.locator("#live-toggle").is_visible()  # nothing scripted happened
    assert page.locator("svg.chart").count() == 4  # the chart is drawn without script
    page.locator("#next-page").click()
    assert page.locator("tr.item").count() == 50
    page.locator("tr.item a").first.click()
    assert page.locator("#detail").is_visible() and page.locator("#history tbody tr").count() >= 1
    # the login link was spent by this browser: another browser cannot use it again
    again = browser.new_context(java_script_enabled=False).new_page()
    response = again.goto(url)
    assert response is not None and response.status == 401
    assert "afterword continuations ui" in again.content()
    assert again.context.cookies() == []


def test_the_forwarding_file_of_open_signs_the_browser_in(
    world: tuple[Server, dict[str, Any]], chromium: Any
) -> None:
    """`ui --open` hands the browser a local file that forwards to the link (test_ui_open.py):
    a navigation begun from a file, which browsers treat as cross-site, so the login must
    still leave the browser signed in despite the SameSite=Strict cookie."""
    server, _ = world
    path = private_scratch_file("login.html", login_page(login_url(server)), prefix="afterword-ui-test-")
    try:
        page = chromium.new_context().new_page()
        page.goto(Path(path).as_uri())
        page.wait_for_url(server.base + "/ui/")
        assert page.locator("#health-status").inner_text(timeout=10_000) in ("unhealthy", "degraded")
        assert page.context.cookies()[0]["sameSite"] == "Strict"
    finally:
        remove_private_scratch(path)


def test_a_missing_browser_skips_locally_but_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard the two tests above start with: they can never silently not run in CI."""
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="cannot run in CI"):
        _browser_or_skip()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="missing"):
        _browser_or_skip()


def test_the_list_fits_1400_px_and_shows_acknowledgement(
    world: tuple[Server, dict[str, Any]], chromium: Any
) -> None:
    """At 1400 px the list's last column (the last error) is inside its panel, nothing
    scrolls sideways, and an acknowledged dead letter says so in the list. (Runs last: it adds
    a record to the module's service.)"""
    server, made = world
    refused = server.claim("refuse", "refused-then-acknowledged")
    server.result(refused, {"summary": "x", "actionable": True})
    server.wait_state(refused, "dead_lettered")
    cid = refused["continuationId"]
    code, _, err = cli(server, "continuations", "acknowledge", cid)
    assert code == 0, err
    page = chromium.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.goto(login_url(server))
    page.wait_for_url(server.base + "/ui/")
    page.evaluate("document.querySelector('#list').scrollIntoView()")
    shoot(page, made["root"], "operator-ui-1400.png")
    fit = page.evaluate(
        """() => {
          const panel = document.querySelector('#list');
          const last = document.querySelector('#items thead th:last-child').getBoundingClientRect();
          const box = panel.getBoundingClientRect();
          return {panelScroll: panel.scrollWidth, panelClient: panel.clientWidth,
                  pageScroll: document.documentElement.scrollWidth, pageClient: document.documentElement.clientWidth,
                  lastRight: last.right, panelRight: box.right};
        }"""
    )
    assert fit["panelScroll"] <= fit["panelClient"], fit
    assert fit["pageScroll"] <= fit["pageClient"], fit
    assert fit["lastRight"] <= fit["panelRight"], fit
    assert page.locator("#items thead th:last-child").inner_text() == "last error"
    row = page.locator(f'tr.item[data-id="{cid}"]')
    assert row.locator(".ack").inner_text() == "acknowledged"
    assert row.locator("code").inner_text() == "http_400"  # the webhook refused it
    others = page.locator(f'tr.item:not([data-id="{cid}"]) .ack').count()
    assert others == 0

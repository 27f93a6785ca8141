"""Helpers for the status page tests: a channel that never confirms, and a signed-in client."""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser

import httpx

from afterword import ContinuationService
from afterword.worker import ChunkDelivery, ChunkReceipt
from afterword.worker.errors import UnconfirmedDeliveryError


class NeverConfirms:
    """A channel whose every post may or may not have happened: each delivery ends
    ``delivery_unknown`` at once."""

    max_chunk_chars = 4000

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        raise UnconfirmedDeliveryError("the channel did not answer")


def operator_headers(service: ContinuationService) -> dict[str, str]:
    return {"Authorization": "Bearer " + service.operator_token()}


async def mint_login(client: httpx.AsyncClient, service: ContinuationService) -> str:
    r = await client.post(service.base_url + "/v1/operator/ui/login", headers=operator_headers(service))
    assert r.status_code == 200, r.text
    url: str = r.json()["loginUrl"]
    assert url.startswith(service.base_url + "/ui/login?token=")
    return url


@dataclass
class Browserless:
    """A signed-in session driven with plain HTTP (the cookie is sent by hand)."""

    client: httpx.AsyncClient
    base: str
    cookie: str

    async def get(self, path: str, **kw: object) -> httpx.Response:
        return await self.client.get(self.base + path, headers={"Cookie": self.cookie}, **kw)  # type: ignore[arg-type]

    async def post(self, path: str, data: dict[str, str], *, origin: str | None = None) -> httpx.Response:
        headers = {"Cookie": self.cookie}
        if origin is not None:
            headers["Origin"] = origin
        return await self.client.post(self.base + path, headers=headers, data=data)

    async def csrf(self, path: str = "/ui/") -> str:
        page = await self.get(path)
        assert page.status_code == 200, page.text
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found is not None
        return found.group(1)


async def sign_in(client: httpx.AsyncClient, service: ContinuationService) -> Browserless:
    client.cookies.clear()
    r = await client.get(await mint_login(client, service))
    assert r.status_code == 200 and "set-cookie" in r.headers, r.text
    cookie = r.headers["set-cookie"].split(";", 1)[0]
    client.cookies.clear()  # every request below names its session itself
    return Browserless(client, service.base_url, cookie)


class PageAudit(HTMLParser):
    """Everything a strict CSP would have to tolerate: inline scripts, event-handler
    attributes, style attributes, and any URL that leaves the service."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self._in_script = False
        self.scripts: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        for name, value in attrs:
            if name.startswith("on"):
                self.problems.append(f"<{tag} {name}>")
            if name == "style":
                self.problems.append(f"<{tag} style>")
            if name in ("src", "href", "action") and value and re.match(r"^([a-z]+:)?//", value):
                self.problems.append(f"<{tag} {name}={value}> leaves the service")
            if name in ("href", "src") and value:
                self.links.append(value)
        if tag == "script":
            self._in_script = True
            if not names.get("src"):
                self.problems.append("<script> without src")
            else:
                self.scripts.append(names["src"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.problems.append("inline script text")


def audit(html: str) -> PageAudit:
    parser = PageAudit()
    parser.feed(html)
    return parser

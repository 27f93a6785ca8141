"""The OpenAPI document: shipped equal to what the wire types generate, served, listing every
route the app registers, and every status it documents is one the service really answers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from _service import DETACHED_TOKEN, payload_hash
from test_http_protocol import Harness, _raw_exchange, auth, serving

import afterword.http
from afterword.clients.operator import read_metrics_token, read_operator_token
from afterword.continuations.capabilities import result_token
from afterword.continuations.model import ErrorInfo
from afterword.http.app import create_app
from afterword.http.openapi import build_openapi, openapi_bytes
from afterword.http.operations import HOST_OPERATIONS, OPERATIONS

pytestmark = pytest.mark.anyio
SHIPPED = Path(afterword.http.__file__).parent / "openapi.json"


def test_the_shipped_document_is_the_generated_one() -> None:
    """Regenerate with ``python -m afterword.http.openapi > afterword/http/openapi.json``."""
    assert SHIPPED.read_bytes() == openapi_bytes()
    doc = json.loads(SHIPPED.read_bytes())
    assert doc["openapi"].startswith("3.1")
    # Bodies come from the wire Structs: a field of ClaimResponse is in the document.
    assert "resultToken" in doc["components"]["schemas"]["ClaimResponse"]["properties"]


def test_the_generator_runs_clean_as_a_module() -> None:
    """``python -m afterword.http.openapi`` under ``-W error``: no warning on stderr (runpy
    warns when the package's own import already loaded the module it is about to run)."""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-m", "afterword.http.openapi"], capture_output=True, timeout=60
    )
    assert done.returncode == 0 and done.stderr == b"", done.stderr.decode()
    assert done.stdout == SHIPPED.read_bytes()


async def test_every_registered_route_is_documented_and_served(tmp_path: Path) -> None:
    doc = build_openapi()
    documented = {(op.method.upper(), op.path) for op in OPERATIONS}
    async with serving(tmp_path) as h:
        app = create_app(h.service)
        registered = set()
        for rule in app.url_map.iter_rules():
            if rule.endpoint == "static" or rule.endpoint.startswith("ui."):
                continue  # the status page's HTML (tests/service/test_ui_http.py), not the JSON API
            path = rule.rule.replace("<", "{").replace(">", "}")
            for method in rule.methods or ():
                if method not in ("HEAD", "OPTIONS"):
                    registered.add((method, path))
        assert registered == documented, registered ^ documented
        assert set(doc["paths"]) == {p for _, p in documented}
        resp = await h.client.get(h.service.base_url + "/v1/openapi.json")
        assert resp.status_code == 200 and resp.json() == doc


def _template(path: str) -> str:
    for op in OPERATIONS:
        parts, want = path.split("/"), op.path.split("/")
        if len(parts) == len(want) and all(
            w.startswith("{") or w == p for p, w in zip(parts, want, strict=True)
        ):
            return op.path
    raise AssertionError(path)


class Seen:
    def __init__(self, h: Harness) -> None:
        self.h = h
        self.pairs: set[tuple[str, str, int]] = set()
        self.port = h.config.port

    def record(self, method: str, path: str, status: int) -> None:
        self.pairs.add((method.lower(), _template(path.split("?")[0]), status))

    async def send(self, method: str, path: str, expect: int, **kw: Any) -> httpx.Response:
        resp = await self.h.client.request(method, self.h.service.base_url + path, **kw)
        assert resp.status_code == expect, (method, path, resp.text)
        body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else None
        if expect >= 400:
            assert body is not None and set(body) == {"error"}, resp.text
        self.record(method, path, resp.status_code)
        return resp

    async def trickle(self, method: str, path: str, headers: dict[str, str]) -> None:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        raw = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n{head}Content-Length: 100\r\n\r\n"
        line, body = await _raw_exchange(self.port, raw.encode(), [b"{"])
        assert line.startswith("HTTP/1.1 408") and body["error"]["code"] == "timeout", line
        self.record(method, path, 408)


async def test_every_documented_status_is_reachable(tmp_path: Path) -> None:
    limits = {"maxActivePerOrigin": 3, "bodyTimeoutMs": 300}
    async with serving(tmp_path, limits=limits) as h:
        s = Seen(h)
        op = auth(read_operator_token(h.config))
        js = {"Content-Type": "application/json"}
        big = {"content": b"x" * 300_000, "headers": js}
        bad_host = {"Host": "evil.example"}
        ddl = h.deadline

        def body(task: str, hash_char: str = "a", **extra: str) -> dict[str, str]:
            return {"taskKey": task, "taskHash": hash_char * 64, "deadline": ddl, **extra}

        # Every operation answers 400 to a foreign Host header, and the document is public.
        # (The host API's statuses are walked in test_host_api.py.)
        ops = [o for o in OPERATIONS if o not in HOST_OPERATIONS]
        for o in ops:
            path = o.path.replace("{cid}", "c_x")
            await s.send(o.method, path, 400, headers=bad_host)
        await s.send("get", "/v1/openapi.json", 200)

        # -- claim ------------------------------------------------------------------------
        _, token = h.bind()
        cp = "/v1/continuations/claim"
        claim = (await s.send("post", cp, 200, json=body("t1"), headers=auth(token))).json()
        await s.send("post", cp, 401, json=body("t1"))
        await s.send("post", cp, 409, json=body("t1", "b"), headers=auth(token))
        await s.send("post", cp, 413, headers={**auth(token), **js}, content=big["content"])
        await s.trickle("POST", cp, {**auth(token), **js})
        await s.send("post", cp, 200, json=body("t2"), headers=auth(token))
        await s.send("post", cp, 200, json=body("t3"), headers=auth(token))
        await s.send("post", cp, 429, json=body("t4"), headers=auth(token))
        other = h.service.begin_run("run-2", "local:other#1", "local:other")
        other_token = other.stdio_env("work-control")["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]
        await other.close()
        await s.send("post", cp, 410, json=body("t5"), headers=auth(other_token))

        # -- detached claim ---------------------------------------------------------------
        dp = "/v1/continuations/detached/claim"
        dh = {**auth(DETACHED_TOKEN), "X-Mono-Agent-Service-Name": "work-control"}
        await s.send("post", dp, 200, json=body("d1", route="background-index"), headers=dh)
        await s.send("post", dp, 401, json=body("d1", route="background-index"), headers=auth(DETACHED_TOKEN))
        await s.send("post", dp, 403, json=body("d1", route="nowhere"), headers=dh)
        await s.send("post", dp, 409, json=body("d1", "b", route="background-index"), headers=dh)
        await s.send("post", dp, 413, headers={**dh, **js}, content=big["content"])
        await s.trickle("POST", dp, {**dh, **js})
        for task in ("d2", "d3"):
            await s.send("post", dp, 200, json=body(task, route="background-index"), headers=dh)
        await s.send("post", dp, 429, json=body("d4", route="background-index"), headers=dh)

        # -- result and status ------------------------------------------------------------
        cid, rtok = claim["continuationId"], claim["resultToken"]
        unknown = result_token(h.service._keys.result, "c_neverclaimed")
        payload = {"summary": "done"}
        result = {"idempotencyKey": "r1", "payloadHash": payload_hash(payload), "payload": payload}
        for method in ("put", "post"):
            rp = f"/v1/continuations/{cid}/result"
            await s.send(method, rp, 401, json=result, headers=auth("x"))
            await s.send(
                method, "/v1/continuations/c_neverclaimed/result", 404, json=result, headers=auth(unknown)
            )
            await s.send(method, rp, 413, headers={**auth(rtok), **js}, content=big["content"])
            await s.trickle(method.upper(), rp, {**auth(rtok), **js})
            await s.send(method, rp, 200, json=result, headers=auth(rtok))
            other_result = {**result, "idempotencyKey": "r2"}
            await s.send(method, rp, 409, json=other_result, headers=auth(rtok))
        await s.send("get", f"/v1/continuations/{cid}", 200, headers=auth(rtok))
        await s.send("get", f"/v1/continuations/{cid}", 401)
        await s.send("get", "/v1/continuations/c_neverclaimed", 404, headers=auth(unknown))

        # -- operator ---------------------------------------------------------------------
        await s.send("get", "/v1/operator/continuations?limit=2", 200, headers=op)
        await s.send("get", "/v1/operator/continuations", 401)
        await s.send("get", "/v1/operator/health", 200, headers=op)
        await s.send("get", "/v1/operator/health", 401)
        await s.send("get", "/v1/operator/metrics", 200, headers=op)
        await s.send("get", "/v1/operator/metrics", 401)
        await s.send("get", "/v1/operator/metrics", 200, headers=auth(read_metrics_token(h.config)))
        await s.send("get", "/v1/livez", 200)
        await s.send("get", f"/v1/operator/continuations/{cid}", 200, headers=op)
        await s.send("get", f"/v1/operator/continuations/{cid}", 401)
        await s.send("get", "/v1/operator/continuations/c_none", 404, headers=op)
        await s.send("get", "/v1/operator/continuations?limit=x", 400, headers=op)
        await s.send("post", "/v1/operator/ui/login", 200, headers=op)
        await s.send("post", "/v1/operator/ui/login", 401)

        second = (
            await s.send("post", "/v1/continuations/claim", 200, json=body("t2"), headers=auth(token))
        ).json()
        c2 = second["continuationId"]
        for verb in ("retry", "cancel", "acknowledge", "resolve"):
            vp = f"/v1/operator/continuations/{c2}/{verb}"
            await s.send("post", vp, 401)
            probe = {"kind": "not_delivered"} if verb == "resolve" else {}
            await s.send("post", f"/v1/operator/continuations/c_none/{verb}", 404, json=probe, headers=op)
            extra = {"json": {"kind": "not_delivered"}} if verb == "resolve" else {}
            if verb != "cancel":
                await s.send("post", vp, 409, headers=op, **extra)  # c2 is active (claimed)
            if verb in ("retry", "resolve"):
                await s.send("post", vp, 413, headers={**op, **js}, content=big["content"])
                await s.trickle("POST", vp, {**op, **js})

        async def force(cid: str, change: Callable[[Any], Any]) -> None:
            rec = h.service.repo.get(cid)
            assert rec is not None
            await h.service.commit([(rec, change(rec))])

        # cid has its result: as a dead letter it can be acknowledged, then retried.
        await force(
            cid,
            lambda r: msgspec.structs.replace(
                r,
                state="dead_lettered",
                last_error=ErrorInfo.bounded("synthesis_failed", "x"),
                terminal_at_ms=r.updated_at_ms,
            ),
        )
        await s.send("post", f"/v1/operator/continuations/{cid}/cancel", 409, headers=op)
        await s.send("post", f"/v1/operator/continuations/{cid}/acknowledge", 200, headers=op)
        await s.send(
            "post", f"/v1/operator/continuations/{cid}/retry", 200, headers=op, json={"allowUnknown": False}
        )
        await force(
            cid,
            lambda r: msgspec.structs.replace(r, state="delivery_unknown", terminal_at_ms=r.updated_at_ms),
        )
        await s.send(
            "post",
            f"/v1/operator/continuations/{cid}/resolve",
            200,
            headers=op,
            json={"kind": "not_delivered"},
        )
        await s.send("post", f"/v1/operator/continuations/{c2}/cancel", 200, headers=op)
        # A record retention compacted: every verb that needs it live answers 410 compacted.
        await force(
            cid, lambda r: msgspec.structs.replace(r, state="expired", terminal_at_ms=r.updated_at_ms)
        )
        await h.service.apply_retention()
        assert h.service.repo.get(cid) is None and h.service.repo.get(c2) is None
        for verb in ("retry", "cancel", "resolve"):
            extra = {"json": {"kind": "not_delivered"}} if verb == "resolve" else {}
            answer = await s.send(
                "post", f"/v1/operator/continuations/{cid}/{verb}", 410, headers=op, **extra
            )
            assert answer.json()["error"]["code"] == "compacted"
        for method in ("put", "post"):
            await s.send(
                method,
                f"/v1/continuations/{c2}/result",
                410,
                json=result,
                headers=auth(second["resultToken"]),
            )

        documented = {(o.method, o.path, status) for o in ops for status in (200, *o.errors)}
        assert documented <= s.pairs, sorted(documented - s.pairs)
        assert s.pairs <= documented, sorted(s.pairs - documented)

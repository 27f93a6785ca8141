"""Requests an attacker on the same host would send: each gets a documented 4xx in the JSON
envelope, never a 500, a silently reinterpreted body, a body read before authentication or
a forged log line."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import httpx
import pytest
from _service import DETACHED_TOKEN, payload_hash
from test_http_protocol import CONV, REPLY, Harness, _raw_exchange, assert_error, auth, serving

from afterword.cli.serve import JsonLineFormatter
from afterword.clients.operator import read_operator_token
from afterword.http.server import ServeError, _bind
from afterword.http.strictjson import MAX_JSON_DEPTH, check_body, nesting_depth

pytestmark = pytest.mark.anyio


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


async def operator_get(h: Harness, query: str) -> httpx.Response:
    token = read_operator_token(h.config)
    return await h.client.get(f"{h.service.base_url}/v1/operator/continuations?{query}", headers=auth(token))


# -- item 4: query numbers ---------------------------------------------------------------------
async def test_query_numbers_are_ascii_digits_only(tmp_path: Any) -> None:
    async with serving(tmp_path) as h:
        for query in ("limit=%C2%B2", "limit=%D9%A3", "limit=%EF%BC%93", "limit=-1", "limit=+3", "limit= 3"):
            assert_error(await operator_get(h, query), 400, "invalid_request")
        assert (await operator_get(h, "limit=3")).status_code == 200
        assert_error(await operator_get(h, "limit=0"), 400, "invalid_request")


# -- item 2: nesting depth and log lines -------------------------------------------------------
async def test_deeply_nested_bodies_are_refused_with_400(tmp_path: Any) -> None:
    async with serving(tmp_path) as h:
        claim = await h.claimed(h.bind()[1])
        url, token = claim["resultUrl"], claim["resultToken"]
        for depth in (MAX_JSON_DEPTH, 1000, 100_000):
            payload = nested(depth)
            body = {"idempotencyKey": "r", "payloadHash": "0" * 64, "payload": payload}
            raw = json.dumps(body).encode() if depth < 1000 else _deep_body(depth)
            resp = await h.client.put(
                url, content=raw, headers={**auth(token), "Content-Type": "application/json"}
            )
            assert "levels" in assert_error(resp, 400, "invalid_request")
        # One level less fits: the body is level 1, so its payload may nest MAX_JSON_DEPTH - 1.
        ok = nested(MAX_JSON_DEPTH - 1)
        resp = await h.client.put(
            url,
            json={"idempotencyKey": "r", "payloadHash": payload_hash(ok), "payload": ok},
            headers=auth(token),
        )
        assert resp.status_code == 200, resp.text


def _deep_body(depth: int) -> bytes:
    return (
        b'{"idempotencyKey":"r","payloadHash":"'
        + b"0" * 64
        + b'","payload":'
        + b"[" * depth
        + b"]" * depth
        + b"}"
    )


def test_nesting_depth_ignores_brackets_inside_strings() -> None:
    assert nesting_depth(b'{"a":"[[[[{{{{","b":["\\"[[["]}') == 2
    assert nesting_depth(b"[" * 10_000) == MAX_JSON_DEPTH + 1  # stops counting early
    check_body(b'{"a":"' + b"[" * 1000 + b'"}')  # brackets in a string are just text


async def test_a_forged_log_line_cannot_be_written(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The reported attack: a deep body on a path carrying a newline and a fake state-change
    event. It is a 4xx now, and nothing logged carries the client's line break."""
    forged = '%0A{"event":"continuation","id":"c_forged","to":"delivered"}%0A'
    async with serving(tmp_path) as h:
        claim = await h.claimed(h.bind()[1])
        caplog.set_level(logging.DEBUG, logger="afterword")
        for path, token in ((f"c_{forged}", "x"), (claim["continuationId"], claim["resultToken"])):
            resp = await h.client.put(
                f"{h.service.base_url}/v1/continuations/{path}/result?{forged}",
                content=_deep_body(1000),
                headers={**auth(token), "Content-Type": "application/json"},
            )
            assert resp.status_code in (400, 401), resp.text
        assert not [r for r in caplog.records if "\n" in r.getMessage() or "c_forged" in r.getMessage()]


def test_log_records_are_one_json_line_each() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLineFormatter())
    logger = logging.getLogger("afterword.test.jsonlines")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)  # independent of the "afterword" level another test module may raise
    try:
        evil = '/v1/x\n{"event":"continuation","id":"c_forged"}\r\n'
        logger.error("unexpected error handling PUT %s", evil)
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            logger.exception("with a traceback")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["message"].endswith(evil) and first["level"] == "error" and first["event"] == "log"
    assert "ValueError: boom\nsecond line" in json.loads(lines[1])["exc"]


# -- item 6: duplicate keys --------------------------------------------------------------------
async def test_duplicate_keys_are_refused_in_every_body(tmp_path: Any) -> None:
    async with serving(tmp_path) as h:
        base = h.service.base_url
        json_type = {"Content-Type": "application/json"}
        detached = (
            b'{"route":"background-index","taskKey":"k","taskHash":"'
            + b"a" * 64
            + b'","deadline":"'
            + h.deadline.encode()
            + b'","route":"daily-attention"}'
        )
        headers = {**auth(DETACHED_TOKEN), "X-Mono-Agent-Service-Name": "work-control", **json_type}
        resp = await h.client.post(
            f"{base}/v1/continuations/detached/claim", content=detached, headers=headers
        )
        assert '"route"' in assert_error(resp, 400, "invalid_request")
        assert h.active == 0

        token = h.bind()[1]
        claim_body = (
            b'{"taskKey":"a","taskKey":"b","taskHash":"'
            + b"a" * 64
            + b'","deadline":"'
            + h.deadline.encode()
            + b'"}'
        )
        resp = await h.client.post(
            h.service.claim_url, content=claim_body, headers={**auth(token), **json_type}
        )
        assert_error(resp, 400, "invalid_request")
        assert h.active == 0

        claim = await h.claimed(token)
        payload = {"x": 1}
        inner = (
            b'{"idempotencyKey":"r","payloadHash":"'
            + payload_hash(payload).encode()
            + b'","payload":{"x":1,"x":2}}'
        )
        resp = await h.client.put(
            claim["resultUrl"], content=inner, headers={**auth(claim["resultToken"]), **json_type}
        )
        assert_error(resp, 400, "invalid_request")

        op = {**auth(read_operator_token(h.config)), **json_type}
        cid = claim["continuationId"]
        for verb, body in (
            ("retry", b'{"allowUnknown":false,"allowUnknown":true}'),
            ("resolve", b'{"kind":"delivered","kind":"not_delivered"}'),
        ):
            resp = await h.client.post(
                f"{base}/v1/operator/continuations/{cid}/{verb}", content=body, headers=op
            )
            assert_error(resp, 400, "invalid_request")
        assert (await h.status(claim)).json()["state"] == "claimed"


# -- item 7: Host header -----------------------------------------------------------------------
async def test_host_header_must_name_this_loopback_service(tmp_path: Any) -> None:
    async with serving(tmp_path) as h:
        claim = await h.claimed(h.bind()[1])
        port = h.config.port
        for host in (
            "evil.example",
            f"evil.example:{port}",
            f"127.0.0.2:{port}",
            "",
            f"localhost.evil:{port}",
        ):
            resp = await h.client.get(
                claim["statusUrl"], headers={**auth(claim["resultToken"]), "Host": host}
            )
            assert "Host" in assert_error(resp, 400, "invalid_request"), host
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.1", f"LOCALHOST:{port}"):
            resp = await h.client.get(
                claim["statusUrl"], headers={**auth(claim["resultToken"]), "Host": host}
            )
            assert resp.status_code == 200, (host, resp.text)


# -- item 3: authentication comes before the body -----------------------------------------------
async def test_credentials_are_checked_before_any_body_is_read(tmp_path: Any) -> None:
    """A stranger declaring a body and sending none is answered at once: the server never
    waits for (or buffers) a body it would refuse."""
    async with serving(tmp_path) as h:
        port = h.config.port
        claim = await h.claimed(h.bind()[1])
        result_path = claim["resultUrl"].split(str(port), 1)[1]
        for method, path, extra in (
            ("POST", "/v1/continuations/claim", ""),
            ("POST", "/v1/continuations/detached/claim", "X-Mono-Agent-Service-Name: work-control\r\n"),
            ("PUT", result_path, ""),
            ("POST", f"/v1/operator/continuations/{claim['continuationId']}/resolve", ""),
        ):
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer x\r\n"
                f"Content-Type: application/json\r\n{extra}Content-Length: 100000\r\n\r\n"
            ).encode()
            line, body = await _raw_exchange(port, head, [])
            assert line.startswith("HTTP/1.1 401"), (path, line)
            assert body["error"]["code"] == "unauthorized"
        assert CONV and REPLY  # the harness binding above used the shared run ids


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1", "example.com", "localhost.example.com"])
def test_the_server_binds_only_a_loopback_host(host: str) -> None:
    # A name that is not an IP address is refused with the same clear error, not a ValueError.
    with pytest.raises(ServeError, match="non-loopback host"):
        _bind(host, 0)

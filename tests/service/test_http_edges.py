"""Inputs at the HTTP edges (issue 28, point 5), through ``serve``'s one door: host API strings bounded and free of control characters, a request
target that is not a path refused, and the first request after the state directory became
unsafe answered with the documented ``503 disk_failed``, as every later one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from test_http_protocol import CONV, REPLY, Harness, _raw_exchange, assert_error, auth, serving

from afterword.clients.operator import read_host_token
from afterword.http.openapi import build_openapi

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[Harness]:
    async with serving(tmp_path) as h:
        h.host_token = read_host_token(h.config)  # type: ignore[attr-defined]
        yield h


# -- host API strings ------------------------------------------------------------------------
BAD_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("runId", {"runId": "run\x00one"}),
    ("runId", {"runId": "r" * 5000}),
    ("runId", {"runId": "r" * 257}),
    ("runId", {"runId": "run-1\n"}),
    ("runId", {"runId": "a/b"}),
    ("runId", {"runId": "run\x85one"}),
    ("runId", {"runId": ".."}),
    ("runId", {"runId": ""}),
    ("replyTo", {"replyTo": "local:c\nX-Forged: 1"}),
    ("replyTo", {"replyTo": "local:c\n"}),
    ("replyTo", {"replyTo": "x" * 1025}),
    ("conversationId", {"conversationId": "local:\x1b[2Jc"}),
    ("conversationId", {"conversationId": "local:\x9bc"}),
    ("conversationId", {"conversationId": "c" * 5000}),
]


async def test_host_api_strings_are_bounded_and_free_of_control_characters(tmp_path: Path) -> None:
    async with served(tmp_path) as h:
        base = h.service.base_url + "/v1/host/runs"
        headers = auth(read_host_token(h.config))
        for field, bad in BAD_RUNS:
            body = {"runId": "run-1", "conversationId": CONV, "replyTo": REPLY, **bad}
            resp = await h.client.post(base, json=body, headers=headers)
            assert field in assert_error(resp, 400, "invalid_request"), (bad, resp.text)
        assert (await h.client.get(base + "/run-1", headers=headers)).status_code == 404  # nothing begun
        fine = {"runId": "r" * 256, "conversationId": "caf\u00e9 \u2603 " + "c" * 1000, "replyTo": REPLY}
        resp = await h.client.post(base, json=fine, headers=headers)
        assert resp.status_code == 200, resp.text


def test_the_openapi_document_shows_the_host_api_bounds() -> None:
    body = build_openapi()["components"]["schemas"]["BeginRunRequest"]["properties"]
    assert body["runId"]["maxLength"] == 256 and body["runId"]["minLength"] == 1
    assert "pattern" in body["runId"]
    conversation = body["conversationId"]
    assert conversation["maxLength"] == 1024 and "pattern" in conversation
    reply = json.dumps(body["replyTo"])
    assert "1024" in reply and "pattern" in reply


# -- the request target ----------------------------------------------------------------------
async def test_an_absolute_form_request_target_is_refused(tmp_path: Path) -> None:
    async with served(tmp_path) as h:
        port = h.config.port
        claim = await h.claimed(h.bind()[1])
        status_path = claim["statusUrl"].split(str(port), 1)[1]
        token = f"Authorization: Bearer {claim['resultToken']}\r\n"
        for target, extra in (
            ("http://evil.com/v1/operator/health", ""),
            ("http://evil.com/v1/livez", ""),
            (f"http://127.0.0.1:{port}/v1/livez", ""),
            (f"http://evil.com{status_path}", token),  # a route the fast path answers
            ("*", ""),
        ):
            head = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode()
            line, body = await _raw_exchange(port, head, [])
            assert line.startswith("HTTP/1.1 400"), (target, line)
            assert body["error"]["code"] == "invalid_request" and "target" in body["error"]["message"]
        head = f"GET {status_path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{token}\r\n".encode()
        line, body = await _raw_exchange(port, head, [])
        assert line.startswith("HTTP/1.1 200") and body["state"] == "claimed"


# -- the first request after the state became unsafe ------------------------------------------
@pytest.mark.parametrize("damage", ["state_dir_moved", "live_segment_deleted"])
async def test_the_first_request_after_the_state_became_unsafe_is_503_disk_failed(
    tmp_path: Path, damage: str
) -> None:
    async with served(tmp_path) as h:
        claim = await h.claimed(h.bind()[1])
        state = Path(h.config.state_dir)
        if damage == "state_dir_moved":
            state.rename(f"{state}.moved")
        else:
            segments = list((state / "wal").glob("*.seg"))
            assert segments
            for segment in segments:
                segment.unlink()
        try:
            codes = []
            for key in ("r-1", "r-2"):  # the result route is one the fast path answers
                resp = await h.submit(claim, {"summary": key}, key)
                codes.append((resp.status_code, resp.json()["error"]["code"]))
            cancel = f"{h.service.base_url}/v1/host/continuations/{claim['continuationId']}/cancel"
            resp = await h.client.post(cancel, headers=auth(h.host_token))  # a route only Quart has
            codes.append((resp.status_code, resp.json()["error"]["code"]))
        finally:
            if damage == "state_dir_moved":
                Path(f"{state}.moved").rename(state)
    assert codes == [(503, "disk_failed")] * 3

"""The producer helper: capability discovery, hashing, retries, typed refusals, no token leaks.

The first half drives the client against a scripted transport (exact requests, exact retry
counts); the second half against the real service in-process over loopback HTTP.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import msgspec
import pytest
from _service import ENV, deadline, load, write_config

import afterword
from afterword.app.binding import RESERVED_ENV, RESERVED_HEADERS
from afterword.producer import (
    CapabilityClosed,
    ClaimCapability,
    ClaimConflict,
    InvalidCapability,
    NoCapability,
    NotAuthorized,
    Producer,
    RejectedByService,
    RetryPolicy,
    ServiceUnavailable,
    format_deadline,
    payload_hash,
    task_hash,
)

TOKEN = "claim-token-SECRET-0123456789"
RESULT_TOKEN = "result-token-SECRET-9876543210"
CLAIM_URL = "http://127.0.0.1:4319/v1/continuations/claim"
CAP = ClaimCapability(claim_url=CLAIM_URL, token=TOKEN, fingerprint="fp-1", mode="reply")


def claim_body(base: str = "http://127.0.0.1:4319") -> dict[str, Any]:
    return {
        "continuationId": "c_1",
        "resultUrl": f"{base}/v1/continuations/c_1/result",
        "statusUrl": f"{base}/v1/continuations/c_1",
        "resultToken": RESULT_TOKEN,
        "expiresAt": "2030-01-02T03:04:05.000Z",
        "fingerprint": "fp-1",
    }


STATUS = {
    "continuationId": "c_1",
    "state": "result_received",
    "originContext": "pinned",
    "mode": "reply",
    "kind": "interactive",
    "attempts": {"synthesis": 0, "delivery": 0},
    "lastError": None,
    "receipt": None,
    "completionKind": None,
    "deferred": False,
    "expiresAt": "2030-01-02T03:04:05.000Z",
    "createdAt": "2030-01-01T03:04:05.000Z",
    "updatedAt": "2030-01-01T03:04:05.000Z",
}


class Script:
    """A transport answering from a list of steps; each step is a response or an exception."""

    def __init__(self, *steps: httpx.Response | Exception) -> None:
        self.steps = list(steps)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def producer(self, attempts: int = 4, rand: Callable[[], float] = lambda: 1.0) -> Producer:
        async def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)

        client = httpx.AsyncClient(transport=httpx.MockTransport(self.handler))
        policy = RetryPolicy(attempts=attempts, base_delay_s=0.1, max_delay_s=0.25)
        return Producer(client=client, retry=policy, sleep=sleep, rand=rand)


def ok(body: Any) -> httpx.Response:
    return httpx.Response(200, json=body)


def refused(status: int, code: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": f"refused: {code}"}})


# -- hashing and time ------------------------------------------------------------------------
def test_payload_hash_is_sha256_of_sorted_compact_json() -> None:
    payload = {"summary": "done ✓", "b": [1, 2.5, None], "a": {"z": True, "y": "x"}}
    expected = hashlib.sha256(
        b'{"a":{"y":"x","z":true},"b":[1,2.5,null],"summary":"done \xe2\x9c\x93"}'
    ).hexdigest()
    assert payload_hash(payload) == expected
    assert payload_hash({"a": 1, "b": 2}) == payload_hash({"b": 2, "a": 1})
    assert task_hash({"job": "x"}) == payload_hash({"job": "x"})


def test_the_producer_and_the_service_share_one_payload_hash() -> None:
    # Two copies could drift apart and every result would then be refused as mismatched.
    from afterword.continuations import rules

    assert payload_hash is rules.payload_hash


def test_format_deadline() -> None:
    now = datetime(2030, 1, 2, 3, 4, 5, 678_900, tzinfo=UTC)
    assert format_deadline(now) == "2030-01-02T03:04:05.678Z"
    assert format_deadline(timedelta(hours=1), now=now) == "2030-01-02T04:04:05.678Z"
    assert format_deadline("2031-01-01T00:00:00.000Z") == "2031-01-01T00:00:00.000Z"
    with pytest.raises(ValueError):
        format_deadline(datetime(2030, 1, 2))


# -- capability discovery -------------------------------------------------------------------
def test_capability_from_env() -> None:
    assert ClaimCapability.from_env({"PATH": "/bin"}) is None
    env = dict(zip(RESERVED_ENV, (CLAIM_URL, TOKEN, "fp-1", "reply"), strict=True))
    cap = ClaimCapability.from_env(env)
    assert cap == CAP
    assert TOKEN not in repr(cap)
    partial = {k: v for k, v in env.items() if not k.endswith("FINGERPRINT")}
    with pytest.raises(InvalidCapability):
        ClaimCapability.from_env(partial)


def test_capability_from_headers_is_case_insensitive() -> None:
    headers = {
        name.upper(): value
        for name, value in zip(RESERVED_HEADERS, (CLAIM_URL, TOKEN, "fp-1", "reply"), strict=True)
    }
    assert ClaimCapability.from_headers(headers) == CAP
    assert ClaimCapability.from_headers({"content-type": "application/json"}) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5:4319/v1/continuations/claim",
        "https://127.0.0.1:4319/v1/continuations/claim",
        "not a url",
    ],
)
def test_capability_refuses_to_send_its_token_off_loopback(url: str) -> None:
    with pytest.raises(InvalidCapability) as info:
        ClaimCapability(claim_url=url, token=TOKEN, fingerprint="fp", mode="reply")
    assert TOKEN not in str(info.value)


def test_mcp_context_over_http_uses_only_the_request_headers() -> None:
    env = dict(zip(RESERVED_ENV, (CLAIM_URL, "env-token", "fp-env", "reply"), strict=True))
    http_ctx = SimpleNamespace(request_context=SimpleNamespace(request=SimpleNamespace(headers={})))
    # An HTTP request without the headers has no capability, even though the process has one.
    assert ClaimCapability.from_mcp_context(http_ctx, env) is None
    stdio_ctx = SimpleNamespace(request_context=SimpleNamespace(request=None))
    cap = ClaimCapability.from_mcp_context(stdio_ctx, env)
    assert cap is not None and cap.token == "env-token"


def test_mcp_context_of_every_framework_and_low_level_handler() -> None:
    env = dict(zip(RESERVED_ENV, (CLAIM_URL, "env-token", "fp-env", "reply"), strict=True))
    headers = dict(zip(RESERVED_HEADERS, (CLAIM_URL, TOKEN, "fp-1", "reply"), strict=True))
    # A low-level Server handler (SDK 2.x ServerRequestContext, 1.x RequestContext) is given
    # the request context itself: its request's headers are the capability, not the env.
    low_level = SimpleNamespace(request=SimpleNamespace(headers=headers))
    assert ClaimCapability.from_mcp_context(low_level, env) == CAP
    assert ClaimCapability.from_mcp_context(SimpleNamespace(request=None), env) == ClaimCapability.from_env(
        env
    )

    class OutsideARequest:  # MCPServer's Context (SDK 2.x) when no request is being handled
        @property
        def request_context(self) -> object:
            raise ValueError("Context is not available outside of a request")

    cap = ClaimCapability.from_mcp_context(OutsideARequest(), env)
    assert cap is not None and cap.token == "env-token"
    # FastMCP 4's Context before a session exists: no request context at all.
    cap = ClaimCapability.from_mcp_context(SimpleNamespace(request_context=None), env)
    assert cap is not None and cap.token == "env-token"


# -- requests, retries, refusals ---------------------------------------------------------------
@pytest.mark.anyio
async def test_claim_request_shape() -> None:
    script = Script(ok(claim_body()))
    async with script.producer() as producer:
        handle = await producer.claim(
            CAP, task_key="k1", task_hash="h" * 64, deadline="2030-01-02T03:04:05.000Z"
        )
    (req,) = script.requests
    assert (req.method, str(req.url)) == ("POST", CLAIM_URL)
    assert req.headers["authorization"] == f"Bearer {TOKEN}"
    assert req.headers["content-type"] == "application/json"
    assert msgspec.json.decode(req.content) == {
        "taskKey": "k1",
        "taskHash": "h" * 64,
        "deadline": "2030-01-02T03:04:05.000Z",
    }
    assert handle.continuation_id == "c_1"
    assert RESULT_TOKEN not in repr(handle)


@pytest.mark.anyio
async def test_submit_result_computes_payload_hash_and_uses_the_result_token() -> None:
    script = Script(ok(claim_body()), ok(STATUS), ok(STATUS))
    payload = {"summary": "done", "items": [3, 1]}
    async with script.producer() as producer:
        handle = await producer.claim(
            CAP, task_key="k1", task_hash="h" * 64, deadline="2030-01-02T03:04:05.000Z"
        )
        status = await handle.submit_result(payload, idempotency_key="r1")
        assert status.state == "result_received"
        resumed = producer.resume(handle.to_json())
        assert (await resumed.status()).continuation_id == "c_1"
    _, put, get = script.requests
    assert (put.method, str(put.url)) == ("PUT", "http://127.0.0.1:4319/v1/continuations/c_1/result")
    assert put.headers["authorization"] == f"Bearer {RESULT_TOKEN}"
    body = msgspec.json.decode(put.content)
    assert body == {"idempotencyKey": "r1", "payloadHash": payload_hash(payload), "payload": payload}
    assert (get.method, get.headers["authorization"]) == ("GET", f"Bearer {RESULT_TOKEN}")


@pytest.mark.anyio
async def test_network_errors_are_retried_with_bounded_backoff(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="afterword.producer")
    script = Script(
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
        httpx.Response(503),
        httpx.Response(502),
        ok(claim_body()),
    )
    async with script.producer(attempts=5) as producer:
        handle = await producer.claim(
            CAP, task_key="k1", task_hash="h" * 64, deadline="2030-01-02T03:04:05.000Z"
        )
    assert handle.continuation_id == "c_1"
    assert len(script.requests) == 5
    # Full jitter with rand() == 1.0: 0.1, 0.2, then capped at 0.25.
    assert script.sleeps == pytest.approx([0.1, 0.2, 0.25, 0.25])
    assert all(r.content == script.requests[0].content for r in script.requests)  # same idempotent body
    assert "retrying" in caplog.text
    assert TOKEN not in caplog.text


@pytest.mark.anyio
async def test_retries_give_up_with_service_unavailable() -> None:
    script = Script(*(httpx.ConnectError("refused") for _ in range(3)))
    async with script.producer(attempts=3) as producer:
        with pytest.raises(ServiceUnavailable) as info:
            await producer.claim(CAP, task_key="k1", task_hash="h" * 64, deadline="2030-01-02T03:04:05.000Z")
    assert len(script.requests) == 3 and len(script.sleeps) == 2
    assert "3 attempt" in str(info.value) and TOKEN not in str(info.value)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (409, "conflict", ClaimConflict),
        (410, "closed", CapabilityClosed),
        (401, "unauthorized", NotAuthorized),
    ],
)
async def test_refusals_are_typed_and_not_retried(
    status: int, code: str, kind: type[RejectedByService]
) -> None:
    script = Script(refused(status, code))
    async with script.producer() as producer:
        with pytest.raises(kind) as info:
            await producer.claim(CAP, task_key="k1", task_hash="h" * 64, deadline="2030-01-02T03:04:05.000Z")
    assert (info.value.status, info.value.code) == (status, code)
    assert len(script.requests) == 1 and script.sleeps == []


@pytest.mark.anyio
async def test_claim_without_capability_and_foreign_result_urls_are_refused() -> None:
    async with Script().producer() as producer:
        with pytest.raises(NoCapability):
            await producer.claim(None, task_key="k", task_hash="h" * 64, deadline="2030-01-02T03:04:05.000Z")
    script = Script(ok(claim_body(base="http://127.0.0.1:9999")))
    async with script.producer() as producer:
        with pytest.raises(InvalidCapability):
            await producer.claim(CAP, task_key="k", task_hash="h" * 64, deadline="2030-01-02T03:04:05.000Z")


# -- against the real service ------------------------------------------------------------------
@pytest.mark.anyio
async def test_against_the_real_service(tmp_path: Path) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat#2030-01-01", "local:chat")
        cap = ClaimCapability.from_env(binding.stdio_env("work-control"))
        assert cap is not None and cap.mode == "reply"
        async with Producer() as producer:
            handle = await producer.claim(
                cap, task_key="job-1", task_hash=task_hash("a"), deadline=deadline()
            )
            again = await producer.claim(
                cap, task_key="job-1", task_hash=task_hash("a"), deadline=handle.expires_at
            )
            assert again.continuation_id == handle.continuation_id  # idempotent
            with pytest.raises(ClaimConflict):
                await producer.claim(
                    cap, task_key="job-1", task_hash=task_hash("b"), deadline=handle.expires_at
                )
            await binding.finalize(
                [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}]
            )
            await binding.activate()
            with pytest.raises(CapabilityClosed):
                await producer.claim(cap, task_key="job-2", task_hash=task_hash("a"), deadline=deadline())
            first = await handle.submit_result({"summary": "done"}, idempotency_key="r-1")
            repeat = await handle.submit_result({"summary": "done"}, idempotency_key="r-1")
            assert first.state == repeat.state == "result_received"
            with pytest.raises(ClaimConflict):
                await handle.submit_result({"summary": "other"}, idempotency_key="r-1")
            status = await handle.status()
            assert (status.continuation_id, status.origin_context, status.mode) == (
                handle.continuation_id,
                "pinned",
                "reply",
            )
            forged = producer.resume(msgspec.structs.replace(handle.response, result_token="x" * 40))
            with pytest.raises(NotAuthorized):
                await forged.status()

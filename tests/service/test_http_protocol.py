"""The producer protocol over real HTTP: claim, result, status and detached claims.

Every test starts the real service (``afterword.open_service``) on a free loopback port and
talks to it with httpx, exactly as a trusted tool server would. The worker is off unless a
test needs a terminal state, so the states observed are the ones the protocol produced.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from _service import DETACHED_TOKEN, ENV, deadline, outbox_lines, payload_hash, write_config

import afterword
from afterword.app.service import ContinuationService, wall_clock_ms
from afterword.config import Config
from afterword.continuations.capabilities import result_token

pytestmark = pytest.mark.anyio

SERVER = "work-control"
CONV = "slack:C1:T1#2030-01-01"
REPLY = "slack:C1:T1"
CLAIM_FIELDS = {"continuationId", "resultUrl", "statusUrl", "resultToken", "expiresAt", "fingerprint"}
# docs/design.md, Contracts: HTTP: the status body carries at least these.
STATUS_FIELDS = {
    "continuationId",
    "state",
    "originContext",
    "mode",
    "attempts",
    "lastError",
    "receipt",
    "completionKind",
}
INDEXER_TOKEN = "indexer-token-fedcba9876543210"
TWO_SERVICES = {
    "detachedServices": [
        {"name": "work-control", "tokenEnv": "AFTERWORD_TEST_DETACHED_TOKEN"},
        {"name": "indexer", "tokenEnv": "AFTERWORD_TEST_INDEXER_TOKEN"},
    ]
}
TWO_ENV = {**ENV, "AFTERWORD_TEST_INDEXER_TOKEN": INDEXER_TOKEN}


class Clock:
    """Wall time plus an offset a test can move forward."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def __call__(self) -> int:
        return wall_clock_ms() + self.offset_ms


@dataclass
class Harness:
    service: ContinuationService
    client: httpx.AsyncClient
    config: Config
    clock: Clock
    # One deadline per test, so repeated requests are byte-identical (deadline() has
    # one-second resolution and would otherwise drift between two calls).
    deadline: str = field(default_factory=lambda: deadline(1))

    @property
    def active(self) -> int:
        return self.service.repo.active_total

    def bind(
        self, run: str = "run-1", conv: str = CONV, reply: str | None = REPLY, mode: str = "reply"
    ) -> tuple[str, str]:
        """A run binding's claim URL and token, read from the reserved stdio variables."""
        env = self.service.begin_run(run, conv, reply, mode).stdio_env(SERVER)
        return env["MONO_AGENT_CONTINUATION_CLAIM_URL"], env["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]

    async def claim(self, token: str, task: str = "task-1", **body: Any) -> httpx.Response:
        doc = {"taskKey": task, "taskHash": "hash-1", "deadline": self.deadline, **body}
        return await self.client.post(
            f"{self.config.base_url}/v1/continuations/claim", headers=auth(token), json=doc
        )

    async def claimed(self, token: str, task: str = "task-1", **body: Any) -> dict[str, Any]:
        resp = await self.claim(token, task, **body)
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    async def detached(
        self,
        route: str = "daily-attention",
        task: str = "d-1",
        *,
        token: str = DETACHED_TOKEN,
        name: str | None = SERVER,
        **body: Any,
    ) -> httpx.Response:
        headers = auth(token)
        if name is not None:
            headers["X-Mono-Agent-Service-Name"] = name
        doc = {"route": route, "taskKey": task, "taskHash": "hash-1", "deadline": self.deadline, **body}
        return await self.client.post(
            f"{self.config.base_url}/v1/continuations/detached/claim", headers=headers, json=doc
        )

    async def submit(
        self,
        claim: Mapping[str, Any],
        payload: Any = None,
        key: str = "result-1",
        method: str = "PUT",
        **over: Any,
    ) -> httpx.Response:
        payload = {"summary": "Completed result"} if payload is None else payload
        doc = {"idempotencyKey": key, "payloadHash": payload_hash(payload), "payload": payload, **over}
        return await self.client.request(
            method, claim["resultUrl"], headers=auth(claim["resultToken"]), json=doc
        )

    async def status(self, claim: Mapping[str, Any], token: str | None = None) -> httpx.Response:
        return await self.client.get(claim["statusUrl"], headers=auth(token or claim["resultToken"]))

    async def wait_status(
        self, claim: Mapping[str, Any], done: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        with anyio.fail_after(15):
            while True:
                body = dict((await self.status(claim)).json())
                if done(body):
                    return body
                await anyio.sleep(0.02)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def serving(
    root: Path,
    *,
    run_worker: bool = False,
    environ: Mapping[str, str] = ENV,
    config: Config | None = None,
    clock: Clock | None = None,
    **continuations: Any,
) -> AsyncIterator[Harness]:
    if config is None:
        config = afterword.load_config(write_config(root, continuations=continuations), environ=environ)
    clock = clock or Clock()
    async with (
        afterword.open_service(config, run_worker=run_worker, environ=environ, clock_ms=clock) as service,
        httpx.AsyncClient(timeout=10) as client,
    ):
        yield Harness(service, client, config, clock)


def assert_error(resp: httpx.Response, status: int, code: str) -> str:
    """The response is exactly the JSON error envelope with this status and code."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["message"])


# -- claim -----------------------------------------------------------------------------------
async def test_claim_happy_path(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        env = h.service.begin_run("run-1", CONV, REPLY).stdio_env(SERVER)
        url, token = env["MONO_AGENT_CONTINUATION_CLAIM_URL"], env["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]
        assert url == f"http://127.0.0.1:{h.config.port}/v1/continuations/claim"
        when = deadline(2)
        resp = await h.client.post(
            url,
            headers=auth(token),
            json={"taskKey": "stable-task-key", "taskHash": "h" * 64, "deadline": when},
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert set(body) == CLAIM_FIELDS
        cid = body["continuationId"]
        assert cid.startswith("c_")
        base = f"http://127.0.0.1:{h.config.port}"
        assert body["resultUrl"] == f"{base}/v1/continuations/{cid}/result"
        assert body["statusUrl"] == f"{base}/v1/continuations/{cid}"
        assert body["expiresAt"] == when
        assert body["fingerprint"] == env["MONO_AGENT_CONTINUATION_CLAIM_FINGERPRINT"]
        assert body["resultToken"] and body["resultToken"] != token
        status = (await h.status(body)).json()
        assert set(status) >= STATUS_FIELDS
        assert status["continuationId"] == cid
        assert (status["state"], status["originContext"], status["mode"]) == ("claimed", "pending", "reply")
        assert status["attempts"] == {"synthesis": 0, "delivery": 0}
        assert (status["lastError"], status["receipt"], status["completionKind"]) == (None, None, None)
        assert status["deferred"] is False and status["kind"] == "interactive"
        assert h.active == 1


async def test_repeated_claim_is_idempotent(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        _, token = h.bind()
        when = deadline(1)
        first = await h.claimed(token, deadline=when)
        assert await h.claimed(token, deadline=when) == first
        # The same instant written with an explicit +00:00 offset is the same deadline.
        same_instant = when.replace("Z", "+00:00")
        assert await h.claimed(token, deadline=same_instant) == first
        assert h.active == 1


async def test_claim_identity_reused_with_a_difference_conflicts(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        _, token = h.bind()
        other_tokens = {
            "run": h.bind(run="run-2")[1],
            "conversation": h.bind(conv="slack:C1:T1#2030-01-02")[1],
            "reply_to": h.bind(reply="slack:C1:T2")[1],
            "mode": h.bind(mode="capture")[1],
        }
        changes: list[tuple[str, str, dict[str, Any], str]] = [
            ("taskHash", token, {"taskHash": "hash-2"}, "taskHash"),
            ("deadline", token, {"deadline": deadline(2)}, "deadline"),
            *((name, t, {}, "binding") for name, t in other_tokens.items()),
        ]
        for change, claim_token, body, word in changes:
            task = f"task-{change}"
            first = await h.claimed(token, task)
            message = assert_error(await h.claim(claim_token, task, **body), 409, "conflict")
            assert word in message, change
            assert (await h.status(first)).json()["state"] == "claimed"
            rec = h.service.repo.get(first["continuationId"])
            assert rec is not None and rec.claim.run_id == "run-1" and rec.claim.task_hash == "hash-1"
            assert await h.claimed(token, task) == first  # the original binding still repeats fine
        assert h.active == len(changes)


def _not_utc() -> str:
    local = datetime.now(UTC).astimezone(timezone(timedelta(hours=2))) + timedelta(days=1)
    return local.strftime("%Y-%m-%dT%H:%M:%S.000+02:00")


async def test_deadline_rules(tmp_path: Path) -> None:
    bad: dict[str, Any] = {
        "past": deadline(-0.001),
        "over 30 days": deadline(30.01),
        "not UTC": _not_utc(),
        "no offset": deadline(1)[:-1],
        "date only": deadline(1)[:10],
        "malformed": "next tuesday",
        "number": 1893456000000,
        "null": None,
    }
    async with serving(tmp_path) as h:
        _, token = h.bind()
        for name, value in bad.items():
            resp = await h.claim(token, f"task-{name.replace(' ', '-')}", deadline=value)
            assert resp.status_code == 400, name
            assert_error(resp, 400, "invalid_request")
        assert h.active == 0
        assert h.service.list_continuations().items == []
        assert (await h.claim(token, deadline=deadline(29.9))).status_code == 200  # control


async def test_claim_body_rules(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        url, token = h.bind()
        when = deadline()
        json_type = "application/json"
        cases: list[tuple[Any, str, int, str]] = [
            ({"taskHash": "h", "deadline": when}, json_type, 400, "invalid_request"),
            ({"taskKey": "", "taskHash": "h", "deadline": when}, json_type, 400, "invalid_request"),
            ({"taskKey": "has space", "taskHash": "h", "deadline": when}, json_type, 400, "invalid_request"),
            ({"taskKey": "k", "taskHash": "", "deadline": when}, json_type, 400, "invalid_request"),
            ({"taskKey": 7, "taskHash": "h", "deadline": when}, json_type, 400, "invalid_request"),
            (["k", "h", when], json_type, 400, "invalid_request"),
            ("not json", json_type, 400, "invalid_request"),
            ({"taskKey": "k", "taskHash": "h", "deadline": when}, "text/plain", 400, "invalid_request"),
            ({"taskKey": "k", "taskHash": "h" * 20_000, "deadline": when}, json_type, 413, "too_large"),
        ]
        for content, ctype, status, code in cases:
            data = content.encode() if isinstance(content, str) else json.dumps(content).encode()
            resp = await h.client.post(url, headers={**auth(token), "Content-Type": ctype}, content=data)
            assert resp.status_code == status, (content if len(data) < 200 else "big", resp.text)
            assert_error(resp, status, code)
        assert h.active == 0


async def test_model_style_routing_fields_are_rejected(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        _, token = h.bind()
        for field_name in ("channelId", "conversationId", "callbackUrl", "replyTo", "route", "mode"):
            evil = {field_name: "slack:C_EVIL:T_EVIL"}
            message = assert_error(await h.claim(token, **evil), 400, "invalid_request")
            assert field_name in message
            if field_name != "route":  # a detached claim names its configured route, nothing else
                assert_error(await h.detached(**evil), 400, "invalid_request")
        assert h.active == 0
        assert h.service.list_continuations().items == []
        # Nothing was created, so the clean request creates the only record, bound by the host.
        good = await h.claimed(token)
        rec = h.service.repo.get(good["continuationId"])
        assert rec is not None and rec.claim.reply_to == REPLY and rec.claim.conversation_id == CONV


# -- result ----------------------------------------------------------------------------------
async def test_result_accept_repeat_and_conflicts(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        _, token = h.bind()
        claim = await h.claimed(token)
        first = await h.submit(claim)
        assert first.status_code == 200, first.text
        body = first.json()
        assert set(body) >= STATUS_FIELDS
        assert (body["state"], body["originContext"], body["deferred"]) == (
            "result_received",
            "pending",
            True,
        )
        # Identical resubmission is safe, by PUT or by POST.
        for method in ("PUT", "POST"):
            again = await h.submit(claim, method=method)
            assert again.status_code == 200 and again.json()["state"] == "result_received"
        assert_error(await h.submit(claim, key="result-2"), 409, "conflict")
        assert_error(await h.submit(claim, payload={"summary": "changed"}), 409, "conflict")
        rec = h.service.repo.get(claim["continuationId"])
        assert rec is not None and rec.result is not None
        assert rec.result.idempotency_key == "result-1"
        assert rec.result.payload == b'{"summary":"Completed result"}'


async def test_result_by_post(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        claim = await h.claimed(h.bind()[1])
        resp = await h.submit(claim, method="POST")
        assert resp.status_code == 200 and resp.json()["state"] == "result_received"
        assert_error(await h.submit(claim, method="PATCH"), 405, "invalid_request")


async def test_result_rejections(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"payloadHash": payload_hash({"summary": "other"})}, "does not match"),
        ({"payloadHash": payload_hash({"summary": "Completed result"}).upper()}, "lowercase"),
        ({"payloadHash": "sha256-of-the-JSON-payload"}, "payloadHash"),
        ({"idempotencyKey": ""}, "idempotencyKey"),
        ({"replyTo": {"conversationId": "slack:C_EVIL:T1"}}, "replyTo"),
        ({"callbackUrl": "http://evil.example/cb"}, "callbackUrl"),
        ({"channelId": "C_EVIL"}, "channelId"),
    ]
    async with serving(tmp_path) as h:
        claim = await h.claimed(h.bind()[1])
        for over, why in cases:
            assert why in assert_error(await h.submit(claim, **over), 400, "invalid_request")
        assert (await h.status(claim)).json()["state"] == "claimed"
        assert (await h.submit(claim)).status_code == 200  # control: the clean body is accepted


def _payload_of_body_size(size: int) -> dict[str, str]:
    """A payload whose result body (as httpx's json= encodes it) is exactly ``size`` bytes."""
    probe = {"idempotencyKey": "result-1", "payloadHash": "0" * 64, "payload": {"blob": ""}}
    overhead = len(json.dumps(probe, separators=(",", ":")).encode())
    return {"blob": "x" * (size - overhead)}


async def _send_exact(h: Harness, claim: Mapping[str, Any], payload: dict[str, str]) -> httpx.Response:
    doc = {"idempotencyKey": "result-1", "payloadHash": payload_hash(payload), "payload": payload}
    data = json.dumps(doc, separators=(",", ":")).encode()
    headers = {**auth(claim["resultToken"]), "Content-Type": "application/json"}
    return await h.client.put(claim["resultUrl"], headers=headers, content=data)


async def test_result_body_cap_boundary(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        claim = await h.claimed(h.bind()[1])
        assert_error(await _send_exact(h, claim, _payload_of_body_size(256 * 1024 + 1)), 413, "too_large")
        assert (await h.status(claim)).json()["state"] == "claimed"
        ok = await _send_exact(h, claim, _payload_of_body_size(256 * 1024))
        assert ok.status_code == 200, ok.text


async def _raw_exchange(port: int, head: bytes, chunks: list[bytes]) -> tuple[str, dict[str, Any]]:
    """Send ``head`` then ``chunks`` while reading the answer concurrently; the server may
    answer (and close) before the body is complete, so send failures are expected."""
    received = b""
    with anyio.fail_after(10):
        stream = await anyio.connect_tcp("127.0.0.1", port)
        async with stream, anyio.create_task_group() as tg:

            async def send() -> None:
                try:
                    await stream.send(head)
                    for chunk in chunks:
                        await stream.send(chunk)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass

            tg.start_soon(send)
            while True:
                head_part, sep, rest = received.partition(b"\r\n\r\n")
                if sep:
                    lines = head_part.decode().split("\r\n")
                    fields = dict(line.split(":", 1) for line in lines[1:])
                    length = int(next(v for k, v in fields.items() if k.lower() == "content-length"))
                    if len(rest) >= length:
                        tg.cancel_scope.cancel()
                        return lines[0], json.loads(rest[:length])
                received += await stream.receive()
    raise AssertionError("unreachable")


def _result_head(h: Harness, claim: Mapping[str, Any], framing: str) -> bytes:
    path = claim["resultUrl"].split(str(h.config.port), 1)[1]
    return (
        f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{h.config.port}\r\n"
        f"Authorization: Bearer {claim['resultToken']}\r\nContent-Type: application/json\r\n"
        f"{framing}\r\n\r\n"
    ).encode()


async def test_result_body_cap_without_content_length(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        claim = await h.claimed(h.bind()[1])
        piece = b"x" * 16384
        chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * 128 + [b"0\r\n\r\n"]  # 2 MiB, chunked
        line, body = await _raw_exchange(
            h.config.port, _result_head(h, claim, "Transfer-Encoding: chunked"), chunks
        )
        assert line.startswith("HTTP/1.1 413"), line
        assert body["error"]["code"] == "too_large"
        assert (await h.status(claim)).json()["state"] == "claimed"


async def test_huge_content_length_is_refused_before_the_body_arrives(tmp_path: Path) -> None:
    """A declared 1 GiB body is refused from its headers: the server must answer while the
    client has sent only a few bytes (it would otherwise wait for the rest forever)."""
    async with serving(tmp_path) as h:
        claim = await h.claimed(h.bind()[1])
        head = _result_head(h, claim, f"Content-Length: {1 << 30}")
        line, body = await _raw_exchange(h.config.port, head, [b'{"idempotencyKey":'])
        assert line.startswith("HTTP/1.1 413"), line
        assert body["error"]["code"] == "too_large"
        assert (await h.status(claim)).json()["state"] == "claimed"


async def test_result_after_deadline_and_after_cancel_is_closed(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        _, token = h.bind()
        late = await h.claimed(token, "late")
        cancelled = await h.claimed(token, "cancelled")
        await h.service.cancel_continuation(cancelled["continuationId"])
        assert_error(await h.submit(cancelled), 410, "closed")
        h.clock.offset_ms = 2 * 24 * 3600 * 1000
        assert_error(await h.submit(late), 410, "closed")
        assert (await h.status(late)).json()["state"] == "claimed"  # status stays readable


# -- status ----------------------------------------------------------------------------------
async def test_status_of_unknown_continuation_is_not_found(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        # A structurally valid token for an id that was never claimed.
        token = result_token(h.service._keys.result, "c_neverclaimed")
        url = f"{h.config.base_url}/v1/continuations/c_neverclaimed"
        assert_error(await h.client.get(url, headers=auth(token)), 404, "not_found")
        doc = {"idempotencyKey": "k", "payloadHash": payload_hash(1), "payload": 1}
        assert_error(await h.client.put(url + "/result", headers=auth(token), json=doc), 404, "not_found")
        assert_error(await h.client.get(f"{h.config.base_url}/v1/nothing-here"), 404, "not_found")
        claim_url = f"{h.config.base_url}/v1/continuations/claim"
        assert_error(await h.client.delete(claim_url), 405, "invalid_request")


# -- token misuse ----------------------------------------------------------------------------
async def test_token_misuse(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        url, token = h.bind()
        one = await h.claimed(token, "one")
        two = await h.claimed(token, "two")
        body = {"taskKey": "three", "taskHash": "h", "deadline": deadline()}
        # Claims: no credential, wrong scheme, forged or foreign tokens.
        assert_error(await h.client.post(url, json=body), 401, "unauthorized")
        assert_error(
            await h.client.post(url, json=body, headers={"Authorization": token}), 401, "unauthorized"
        )
        assert_error(
            await h.client.post(url, json=body, headers={"Authorization": f"Basic {token}"}),
            401,
            "unauthorized",
        )
        forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        for bad in (forged, one["resultToken"], DETACHED_TOKEN, h.service.operator_token(), "awc1.x.y"):
            assert_error(await h.client.post(url, json=body, headers=auth(bad)), 401, "unauthorized")
        # Results and status: only this continuation's own result token.
        doc = {"idempotencyKey": "k", "payloadHash": payload_hash({"a": 1}), "payload": {"a": 1}}
        for bad in (two["resultToken"], token, h.service.operator_token(), DETACHED_TOKEN, ""):
            headers = auth(bad) if bad else {}
            assert_error(await h.client.put(one["resultUrl"], json=doc, headers=headers), 401, "unauthorized")
            assert_error(await h.client.get(one["statusUrl"], headers=headers), 401, "unauthorized")
        assert h.active == 2
        assert (await h.status(one)).json()["state"] == "claimed"


async def test_claim_token_after_close_is_gone(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        binding = h.service.begin_run("run-1", CONV, REPLY)
        token = binding.stdio_env(SERVER)["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]
        first = await h.claimed(token)
        assert await binding.close() == [first["continuationId"]]
        assert_error(await h.claim(token, "after-close"), 410, "closed")
        # An identical repeat of the admitted claim (its first response lost) stays idempotent
        # and creates nothing; a different hash for it is still a conflict.
        repeat = await h.claim(token)
        assert repeat.status_code == 200 and repeat.json() == first
        assert_error(await h.claim(token, taskHash="other"), 409, "conflict")
        assert h.active == 1
        # The result side is unaffected by closing the claim capability.
        assert (await h.submit(first)).status_code == 200


async def test_claim_capability_is_short_lived(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        _, token = h.bind()
        h.clock.offset_ms = 60 * 60 * 1000 + 1
        assert_error(await h.claim(token), 410, "closed")
        assert h.active == 0


# -- detached claims -------------------------------------------------------------------------
async def test_detached_claim(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        resp = await h.detached()
        assert resp.status_code == 200, resp.text
        claim = resp.json()
        assert set(claim) == CLAIM_FIELDS
        assert (await h.detached()).json() == claim  # idempotent
        assert_error(await h.detached(taskHash="hash-2"), 409, "conflict")
        status = (await h.status(claim)).json()
        assert (status["kind"], status["mode"], status["originContext"]) == (
            "detached",
            "notify_if_actionable",
            "detached_latest",
        )
        rec = h.service.repo.get(claim["continuationId"])
        assert rec is not None and rec.claim.route == "daily-attention"
        assert rec.claim.conversation_id == "slack:C_DAILY:T_1"  # the route's, never the caller's
        # Detached results are not deferred: there is no origin run to settle.
        assert (await h.submit(claim)).json()["deferred"] is False
        # The same task key on another route is another binding: a conflict.
        assert_error(await h.detached(route="verification"), 409, "conflict")


async def test_detached_credentials_and_routes(tmp_path: Path) -> None:
    async with serving(tmp_path, environ=TWO_ENV, **TWO_SERVICES) as h:
        assert_error(await h.detached(name=None), 401, "unauthorized")
        assert_error(await h.detached(name="nobody"), 401, "unauthorized")
        assert_error(await h.detached(token="x" * 31), 401, "unauthorized")
        assert_error(await h.detached(token=DETACHED_TOKEN[:-1]), 401, "unauthorized")
        # A configured service's token does not work under another service's name.
        assert_error(await h.detached(token=INDEXER_TOKEN), 401, "unauthorized")
        assert_error(await h.detached(name="indexer"), 401, "unauthorized")
        # Interactive claim tokens are not detached credentials, and vice versa.
        _, claim_token = h.bind()
        assert_error(await h.detached(token=claim_token), 401, "unauthorized")
        assert_error(await h.claim(DETACHED_TOKEN), 401, "unauthorized")
        # A valid service may only claim a configured named route.
        assert_error(await h.detached(route="slack:C_EVIL:T1"), 403, "forbidden")
        assert_error(await h.detached(route="reply"), 403, "forbidden")
        assert h.active == 0
        # Control: each service with its own token succeeds.
        assert (await h.detached(name="indexer", token=INDEXER_TOKEN)).status_code == 200
        assert (await h.detached(task="d-2")).status_code == 200
        assert h.active == 2


# -- admission limits ------------------------------------------------------------------------
async def test_global_admission_limit(tmp_path: Path) -> None:
    async with serving(tmp_path, limits={"maxActiveRecords": 2}) as h:
        _, a = h.bind("run-a")
        _, b = h.bind("run-b")
        first = await h.claimed(a, "t1")
        await h.claimed(b, "t2")
        assert_error(await h.claim(b, "t3"), 429, "admission_limit")
        assert_error(await h.detached(task="t4"), 429, "admission_limit")
        assert h.active == 2
        assert await h.claimed(a, "t1") == first  # a repeat is not a new admission
        # A terminal record frees its slot.
        await h.service.cancel_continuation(first["continuationId"])
        assert (await h.claim(b, "t3")).status_code == 200


async def test_per_origin_admission_limit(tmp_path: Path) -> None:
    async with serving(tmp_path, limits={"maxActivePerOrigin": 1}) as h:
        _, a = h.bind("run-a")
        await h.claimed(a, "t1")
        assert_error(await h.claim(a, "t2"), 429, "admission_limit")
        _, b = h.bind("run-b")
        assert (await h.claim(b, "t2")).status_code == 200  # another origin run
        assert (await h.detached(task="t3")).status_code == 200
        assert_error(await h.detached(task="t4"), 429, "admission_limit")  # same detached route
        assert (await h.detached("verification", task="t5")).status_code == 200
        assert h.active == 4


# -- terminal idempotency and restart ---------------------------------------------------------
async def test_terminal_claim_and_result_stay_idempotent(tmp_path: Path) -> None:
    async with serving(tmp_path, run_worker=True) as h:
        claim = (await h.detached("background-index", task="silent-1")).json()
        assert (await h.submit(claim)).status_code == 200
        done = await h.wait_status(claim, lambda s: s["state"] == "delivered")
        assert done["completionKind"] == "silent" and done["receipt"]["kind"] == "silent"
        assert outbox_lines(h.config) == []  # silent: nothing posted
        # Both while the terminal record is live and after it is compacted into a tombstone.
        for compacted in (False, True):
            if compacted:
                await h.service.apply_retention()
                cid = claim["continuationId"]
                assert h.service.repo.get(cid) is None and h.service.repo.tombstone(cid) is not None
            assert (await h.detached("background-index", task="silent-1")).json() == claim
            assert_error(
                await h.detached("background-index", task="silent-1", taskHash="h2"), 409, "conflict"
            )
            again = await h.submit(claim)
            assert again.status_code == 200, again.text
            assert (again.json()["state"], again.json()["compacted"]) == ("delivered", compacted)
            assert_error(await h.submit(claim, key="result-2"), 409, "conflict")
            assert_error(await h.submit(claim, payload={"summary": "other"}), 409, "conflict")
            assert (await h.status(claim)).json()["state"] == "delivered"


# -- concurrency -----------------------------------------------------------------------------
async def test_concurrent_claims_never_exceed_the_limit(tmp_path: Path) -> None:
    async with serving(tmp_path, limits={"maxActiveRecords": 3}) as h:
        tokens = [h.bind(f"run-{i}")[1] for i in range(8)]
        codes: list[int] = []

        async def one(i: int) -> None:
            codes.append((await h.claim(tokens[i], f"task-{i}")).status_code)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
        assert sorted(codes) == [200] * 3 + [429] * 5
        assert h.active == 3


async def test_concurrent_identical_claims_create_one_record(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        _, token = h.bind()
        bodies: list[Any] = []

        async def one() -> None:
            bodies.append((await h.claim(token)).json())

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(one)
        assert all(b == bodies[0] for b in bodies) and set(bodies[0]) == CLAIM_FIELDS
        assert h.active == 1


async def test_concurrent_different_results_accept_exactly_one(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        claim = await h.claimed(h.bind()[1])
        codes: dict[str, list[int]] = {"a": [], "b": []}

        async def one(key: str) -> None:
            codes[key].append((await h.submit(claim, key=key, payload={"k": key})).status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one, "a")
                tg.start_soon(one, "b")
        rec = h.service.repo.get(claim["continuationId"])
        assert rec is not None and rec.result is not None
        winner = rec.result.idempotency_key
        loser = "b" if winner == "a" else "a"
        assert codes[winner] == [200] * 3 and codes[loser] == [409] * 3


async def test_restart_between_claim_and_result(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        config = h.config
        binding = h.service.begin_run("run-1", CONV, REPLY)
        claim = await h.claimed(binding.stdio_env(SERVER)["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"])
        await binding.finalize(
            [{"role": "user", "content": "start it"}, {"role": "assistant", "content": "ok"}]
        )
        await binding.activate()
    # A new process on the same configuration: same fixed port, same derived tokens.
    async with serving(tmp_path, config=config, run_worker=True) as h:
        resp = await h.submit(claim)
        assert resp.status_code == 200, resp.text
        assert resp.json()["originContext"] == "pinned"
        done = await h.wait_status(claim, lambda s: s["state"] == "delivered")
        assert done["completionKind"] == "synthesized"
        lines = outbox_lines(h.config)
        assert [line["conversationId"] for line in lines] == [REPLY]
        assert "Completed result" in lines[0]["text"]

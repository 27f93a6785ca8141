"""No credential ever appears in a log record, an error body, a status body or a state file.

One full flow over real HTTP, with every error path we can provoke, while every log record
(all loggers, DEBUG and up) is captured. Claim tokens, result tokens, detached-service
bearers and the operator capability are then searched for as substrings everywhere.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from _service import DETACHED_TOKEN, ENV, deadline, outbox_lines, payload_hash, write_config

import afterword

pytestmark = pytest.mark.anyio

SERVER = "work-control"
INDEXER_TOKEN = "indexer-token-fedcba9876543210"
ENVIRON = {**ENV, "AFTERWORD_TEST_INDEXER_TOKEN": INDEXER_TOKEN}
DETACHED = [
    {"name": SERVER, "tokenEnv": "AFTERWORD_TEST_DETACHED_TOKEN"},
    {"name": "indexer", "tokenEnv": "AFTERWORD_TEST_INDEXER_TOKEN"},
]


class Transcript:
    """Every response the flow saw, split by whether it may legitimately carry a token."""

    def __init__(self) -> None:
        self.claim_responses: list[dict[str, Any]] = []
        self.other: list[str] = []
        self.statuses: list[int] = []

    def record(self, resp: httpx.Response, *, claim: bool = False) -> httpx.Response:
        self.statuses.append(resp.status_code)
        if claim and resp.status_code == 200:
            self.claim_responses.append(resp.json())
        else:
            self.other.append(resp.text)
        self.other.extend(f"{k}: {v}" for k, v in resp.headers.items())
        return resp


def _forged(token: str) -> str:
    return token[:-3] + ("xyz" if not token.endswith("xyz") else "abc")


async def test_no_token_in_logs_bodies_or_state(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("afterword", "hypercorn", "quart", "asyncio"):
        caplog.set_level(logging.DEBUG, logger=name)
    path = write_config(
        tmp_path, continuations={"detachedServices": DETACHED, "limits": {"maxActivePerOrigin": 3}}
    )
    config = afterword.load_config(path, environ=ENVIRON)
    t = Transcript()
    when = deadline(1)
    async with (
        afterword.open_service(config, environ=ENVIRON) as service,
        httpx.AsyncClient(timeout=10) as client,
    ):
        base = config.base_url
        operator = service.operator_token()
        binding = service.begin_run("run-1", "slack:C1:T1#2030-01-01", "slack:C1:T1")
        env = binding.stdio_env(SERVER)
        claim_url, claim_token = (
            env["MONO_AGENT_CONTINUATION_CLAIM_URL"],
            env["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"],
        )
        repr_texts = [repr(binding), repr(service.config), *(repr(c) for c in binding._caps.values())]

        def bearer(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}

        async def claim(token: str, task: str, **extra: Any) -> httpx.Response:
            body = {"taskKey": task, "taskHash": "hash-1", "deadline": when, **extra}
            return t.record(await client.post(claim_url, headers=bearer(token), json=body), claim=True)

        async def detached(
            token: str, name: str | None, route: str, task: str, **extra: Any
        ) -> httpx.Response:
            headers = bearer(token)
            if name is not None:
                headers["X-Mono-Agent-Service-Name"] = name
            body = {"route": route, "taskKey": task, "taskHash": "hash-1", "deadline": when, **extra}
            url = f"{base}/v1/continuations/detached/claim"
            return t.record(await client.post(url, headers=headers, json=body), claim=True)

        # Interactive claims: success, repeat, conflict, limits, every credential mistake.
        assert (await claim(claim_token, "task-1")).status_code == 200
        assert (await claim(claim_token, "task-1")).status_code == 200
        assert (await claim(claim_token, "task-1", deadline=deadline(2))).status_code == 409
        assert (await claim(claim_token, "task-2")).status_code == 200
        assert (await claim(claim_token, "task-3")).status_code == 200
        assert (await claim(claim_token, "task-4")).status_code == 429
        assert (await claim(claim_token, "task-5", deadline=claim_token)).status_code == 400
        assert (await claim(claim_token, "task-5", replyTo=claim_token)).status_code == 400
        for bad in (_forged(claim_token), DETACHED_TOKEN, operator, claim_token + "x"):
            assert (await claim(bad, "task-6")).status_code == 401
        first, second = t.claim_responses[0], t.claim_responses[2]
        result_tokens = {c["resultToken"] for c in t.claim_responses}

        # Detached claims: success and each refusal.
        assert (await detached(DETACHED_TOKEN, SERVER, "daily-attention", "d-1")).status_code == 200
        assert (await detached(INDEXER_TOKEN, SERVER, "daily-attention", "d-2")).status_code == 401
        assert (await detached(DETACHED_TOKEN, None, "daily-attention", "d-2")).status_code == 401
        assert (await detached(DETACHED_TOKEN, "nobody", "daily-attention", "d-2")).status_code == 401
        assert (await detached(DETACHED_TOKEN, SERVER, "no-such-route", "d-2")).status_code == 403
        assert (
            await detached(DETACHED_TOKEN, SERVER, "daily-attention", "d-2", channelId="C")
        ).status_code == 400
        assert (await detached(_forged(INDEXER_TOKEN), "indexer", "verification", "d-3")).status_code == 401
        result_tokens |= {c["resultToken"] for c in t.claim_responses}

        # Results and status: success, repeat, each rejection, each wrong credential.
        payload = {"summary": "Indexed 42 files"}
        good = {"idempotencyKey": "result-1", "payloadHash": payload_hash(payload), "payload": payload}

        async def put(target: dict[str, Any], token: str, body: Any, **kw: Any) -> httpx.Response:
            return t.record(await client.put(target["resultUrl"], headers=bearer(token), json=body, **kw))

        assert (await put(first, first["resultToken"], good)).status_code == 200
        assert (await put(first, first["resultToken"], good)).status_code == 200
        assert (await put(first, first["resultToken"], {**good, "idempotencyKey": "r2"})).status_code == 409
        assert (
            await put(second, second["resultToken"], {**good, "payloadHash": "0" * 64})
        ).status_code == 400
        assert (await put(second, second["resultToken"], {**good, "callbackUrl": "x"})).status_code == 400
        big = {"idempotencyKey": "r", "payloadHash": "0" * 64, "payload": "x" * (300 * 1024)}
        assert (await put(second, second["resultToken"], big)).status_code == 413
        for bad in (
            first["resultToken"],
            _forged(second["resultToken"]),
            claim_token,
            operator,
            DETACHED_TOKEN,
        ):
            assert (await put(second, bad, good)).status_code == 401
            resp = await client.get(second["statusUrl"], headers=bearer(bad))
            assert t.record(resp).status_code == 401
        resp = await client.get(first["statusUrl"], headers=bearer(first["resultToken"]))
        assert t.record(resp).status_code == 200

        # Operator surface: authorized calls and refusals.
        for url in ("/v1/operator/health", "/v1/operator/continuations?limit=2", "/v1/operator/metrics"):
            assert t.record(await client.get(base + url, headers=bearer(operator))).status_code == 200
            assert (
                t.record(await client.get(base + url, headers=bearer(_forged(operator)))).status_code == 401
            )
            assert t.record(await client.get(base + url, headers=bearer(claim_token))).status_code == 401
        cancel_url = f"{base}/v1/operator/continuations/{second['continuationId']}/cancel"
        assert t.record(await client.post(cancel_url, headers=bearer(operator))).status_code == 200
        retry_url = f"{base}/v1/operator/continuations/{second['continuationId']}/retry"
        assert t.record(await client.post(retry_url, headers=bearer(operator))).status_code == 409
        assert t.record(await client.get(f"{base}/v1/unknown", headers=bearer(operator))).status_code == 404

        # Close, finalize, activate: the worker synthesizes and delivers.
        await binding.close()
        assert (await claim(claim_token, "after-close")).status_code == 410
        await binding.finalize(
            [{"role": "user", "content": "index it"}, {"role": "assistant", "content": "ok"}]
        )
        await binding.activate()
        with anyio.fail_after(15):
            while True:
                resp = await client.get(first["statusUrl"], headers=bearer(first["resultToken"]))
                if resp.json()["state"] == "delivered":
                    t.record(resp)
                    break
                await anyio.sleep(0.02)
        repr_texts += [repr(binding), repr(service)]
    # The store is closed; the state directory is quiescent.
    state_files = [p for p in Path(config.state_dir).rglob("*") if p.is_file()]
    outbox = [str(line) for line in outbox_lines(config)]

    tokens = {
        "claim token": {claim_token},
        "result token": result_tokens,
        "detached token": {DETACHED_TOKEN, INDEXER_TOKEN},
        "operator token": {operator},
    }
    assert len(result_tokens) >= 4 and all(result_tokens)

    # The scan must have material to scan (the flow above actually ran and logged).
    logs = []
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    for rec in caplog.records:
        logs.append(formatter.format(rec))
        logs.append(repr(rec.args))
        if rec.exc_info:
            logs.append(formatter.formatException(rec.exc_info))
    joined_logs = "\n".join(logs)
    assert "claimed by" in joined_logs and "delivered" in joined_logs
    assert {400, 401, 403, 404, 409, 410, 413, 429} <= set(t.statuses)
    assert state_files and outbox

    haystacks: dict[str, str] = {
        "logs": joined_logs,
        "responses": "\n".join(t.other),
        "reprs": "\n".join(repr_texts),
        "outbox": "\n".join(outbox),
    }
    for path in state_files:
        haystacks[f"state file {path.relative_to(config.state_dir)}"] = path.read_bytes().decode("latin-1")
    for kind, values in tokens.items():
        for value in values:
            for where, text in haystacks.items():
                assert value not in text, f"a {kind} appears in {where}"

    # A successful claim response carries exactly its own result token and nothing else.
    others = tokens["claim token"] | tokens["detached token"] | tokens["operator token"]
    for body in t.claim_responses:
        text = str(body)
        assert body["resultToken"] in text
        assert not any(v in text for v in others | (result_tokens - {body["resultToken"]}))

"""Security checks of the spec, end to end over the real loopback HTTP service (and a real
stdio MCP server for the unlisted-server case).

Routing authority comes only from the host: the capability token binds run, server, origin,
reply route and mode. A model-provided channel id, callback URL or context id, a copied or
forged capability header, and an unlisted server all get nowhere.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from _service import DETACHED_TOKEN, ENV, deadline, load, outbox_lines, write_config

import afterword
from afterword.app.binding import RESERVED_ENV
from afterword.config import Config
from afterword.mcp_host import connect_servers, tool_outcome
from afterword.producer import (
    CapabilityClosed,
    ClaimCapability,
    Forbidden,
    NotAuthorized,
    Producer,
    task_hash,
)

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "work_control_server.py")
HISTORY = [{"role": "user", "content": "do it"}, {"role": "assistant", "content": "started"}]
ROUTING_FIELDS = {
    "conversationId": "slack:C_ATTACKER:T_1",
    "replyTo": {"conversationId": "slack:C_ATTACKER:T_1"},
    "channel": "slack:C_ATTACKER",
    "callbackUrl": "http://127.0.0.1:1/callback",
    "contextId": "a2a-context-7",
}


def claim_body(**extra: Any) -> dict[str, Any]:
    return {"taskKey": "t-1", "taskHash": task_hash("t"), "deadline": deadline(), **extra}


def bound_token(binding: Any) -> str:
    return str(binding.stdio_env("work-control")["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"])


async def post(url: str, token: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    send = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", **(headers or {})}
    async with httpx.AsyncClient(trust_env=False) as client:
        return await client.post(url, content=msgspec.json.encode(body), headers=send)


@pytest.mark.anyio
@pytest.mark.parametrize("field", sorted(ROUTING_FIELDS))
async def test_routing_fields_in_a_claim_are_rejected(tmp_path: Path, field: str) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat", "local:chat")
        token = bound_token(binding)
        response = await post(service.claim_url, token, claim_body(**{field: ROUTING_FIELDS[field]}))
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_request"
        detached = await post(
            f"{config.base_url}/v1/continuations/detached/claim",
            DETACHED_TOKEN,
            claim_body(route="daily-attention", **{field: ROUTING_FIELDS[field]}),
            {"X-Mono-Agent-Service-Name": "work-control"},
        )
        assert detached.status_code == 400
        assert service.list_continuations().items == []


@pytest.mark.anyio
async def test_copied_or_forged_capability_headers_have_no_routing_authority(tmp_path: Path) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat#2030-01-01", "local:chat")
        real = ClaimCapability.from_env(binding.stdio_env("work-control"))
        assert real is not None
        # Header values a model copied and edited: another mode and fingerprint. Only the token
        # is read by the service, and it carries the binding.
        forged = ClaimCapability(
            claim_url=real.claim_url, token=real.token, fingerprint="forged", mode="capture"
        )
        async with Producer() as producer:
            handle = await producer.claim(forged, task_key="t-1", task_hash=task_hash(1), deadline=deadline())
            assert handle.fingerprint == real.fingerprint != "forged"
            status = await handle.status()
            assert (status.mode, status.kind) == ("reply", "interactive")
            (item,) = service.list_continuations().items
            assert item.server_name == "work-control"
            # A made-up token, and a real one replayed after its run settled, both fail.
            guessed = ClaimCapability(claim_url=real.claim_url, token="x" * 43, fingerprint="f", mode="reply")
            with pytest.raises(NotAuthorized):
                await producer.claim(guessed, task_key="t-2", task_hash=task_hash(2), deadline=deadline())
            await binding.finalize(HISTORY)
            await binding.activate()
            with pytest.raises(CapabilityClosed):
                await producer.claim(real, task_key="t-3", task_hash=task_hash(3), deadline=deadline())
        assert len(service.list_continuations().items) == 1


@pytest.mark.anyio
async def test_an_a2a_context_id_is_not_a_route(tmp_path: Path) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV) as service, Producer() as producer:
        # A context id (or the physical conversation behind a route) is not a route name.
        for route in ("a2a-context-7", "slack:C_DAILY:T_1"):
            with pytest.raises(Forbidden):
                await producer.detached_claim(
                    config.base_url,
                    service_name="work-control",
                    token=DETACHED_TOKEN,
                    route=route,
                    task_key=f"d-{route}",
                    task_hash=task_hash(route),
                    deadline=deadline(),
                )
        assert service.list_continuations().items == []
        # An interactive run correlated by an A2A context id still answers on the host's
        # reply route, never on the context id.
        binding = service.begin_run("run-a2a", "a2a:context-7", "local:chat-9")
        cap = ClaimCapability.from_env(binding.stdio_env("work-control"))
        handle = await producer.claim(cap, task_key="a2a-1", task_hash=task_hash(1), deadline=deadline())
        await binding.finalize(HISTORY)
        await binding.activate()
        await handle.submit_result({"summary": "done", "contextId": "a2a:context-7"}, idempotency_key="r")
        with anyio.fail_after(30):
            while (await handle.status()).state != "delivered":
                await anyio.sleep(0.02)
    assert [line["conversationId"] for line in outbox_lines(config)] == ["local:chat-9"]


def unlisted_config(config: Config, copied: dict[str, str]) -> Config:
    """The MCP config names a second server, not selected, into whose env someone copied the
    selected server's live capability values."""
    helper = afterword.config.McpServer(
        name="helper", transport="stdio", command=sys.executable, args=(EXAMPLE,), env=copied
    )
    return msgspec.structs.replace(config, mcp_servers={**config.mcp_servers, "helper": helper})


@pytest.mark.anyio
async def test_an_unlisted_server_gets_no_capability(tmp_path: Path) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat", "local:chat")
        live = {k: v for k, v in binding.stdio_env("work-control").items() if k in RESERVED_ENV}
        assert len(live) == 4
        with_copies = unlisted_config(config, live)
        with (tmp_path / "helper.log").open("w") as errlog:
            async with connect_servers(binding, with_copies, ["helper"], errlog=errlog) as sessions:
                result = await sessions["helper"].call_tool("start_job", {"job": "sneak", "seconds": 0})
        outcome = tool_outcome(result)
        assert outcome.failed
        text = outcome.text
        assert "holds no continuation capability" in text
        assert await binding.close() == []
        assert service.list_continuations().items == []


@pytest.mark.anyio
async def test_detached_claim_needs_the_service_token(tmp_path: Path) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, run_worker=False) as service:
        async with Producer() as producer:
            with pytest.raises(NotAuthorized):
                await producer.detached_claim(
                    config.base_url,
                    service_name="work-control",
                    token="wrong-token-0123456789",
                    route="daily-attention",
                    task_key="d-1",
                    task_hash=task_hash(1),
                    deadline=deadline(),
                )
        assert service.list_continuations().items == []

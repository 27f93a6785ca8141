"""A fake continuation producer (the selected MCP server's side) and host-side shortcuts.

The producer talks to the service only over real HTTP, following the URLs and tokens the
claim response hands it, exactly as docs/design.md (Contracts: HTTP) describes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import msgspec
from _service import DETACHED_TOKEN, deadline, payload_hash

from afterword import ContinuationService
from afterword.app.binding import RunBinding
from afterword.continuations.model import Continuation

SERVER = "work-control"
ORIGIN_HISTORY: tuple[Mapping[str, str], ...] = (
    {"role": "user", "content": "Please index the repository."},
    {"role": "assistant", "content": "Started; I will report back."},
)
TERMINAL = ("delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered")


@dataclass(frozen=True)
class Claimed:
    id: str
    result_url: str
    status_url: str
    token: str

    @classmethod
    def from_response(cls, body: Mapping[str, Any]) -> Claimed:
        return cls(body["continuationId"], body["resultUrl"], body["statusUrl"], body["resultToken"])


class Producer:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def claim(self, binding: RunBinding, task_key: str, *, server: str = SERVER) -> Claimed:
        env = binding.stdio_env(server)
        response = await self.client.post(
            env["MONO_AGENT_CONTINUATION_CLAIM_URL"],
            headers={"Authorization": f"Bearer {env['MONO_AGENT_CONTINUATION_CLAIM_TOKEN']}"},
            json={"taskKey": task_key, "taskHash": "h-" + task_key, "deadline": deadline()},
        )
        assert response.status_code == 200, response.text
        return Claimed.from_response(response.json())

    async def detached(self, base_url: str, route: str, task_key: str) -> Claimed:
        response = await self.client.post(
            f"{base_url}/v1/continuations/detached/claim",
            headers={"Authorization": f"Bearer {DETACHED_TOKEN}", "X-Mono-Agent-Service-Name": SERVER},
            json={"route": route, "taskKey": task_key, "taskHash": "h-" + task_key, "deadline": deadline()},
        )
        assert response.status_code == 200, response.text
        return Claimed.from_response(response.json())

    async def submit(self, claimed: Claimed, payload: Any, key: str = "result-1") -> httpx.Response:
        return await self.client.put(
            claimed.result_url,
            headers={"Authorization": f"Bearer {claimed.token}"},
            json={"idempotencyKey": key, "payloadHash": payload_hash(payload), "payload": payload},
        )

    async def status(self, claimed: Claimed) -> dict[str, Any]:
        response = await self.client.get(
            claimed.status_url, headers={"Authorization": f"Bearer {claimed.token}"}
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


async def settle(
    binding: RunBinding, history: Sequence[Mapping[str, str]] = ORIGIN_HISTORY, how: str = "activate"
) -> None:
    """The host finishes the origin turn: close, then finalize + activate, or abandon."""
    await binding.close()
    if how == "abandon":
        await binding.abandon()
        return
    await binding.finalize(history)
    await binding.activate()


async def reply_run(
    service: ContinuationService,
    producer: Producer,
    payload: Any,
    *,
    run_id: str = "run-1",
    conversation_id: str = "slack:C1:T1#2030-01-01",
    reply_to: str | None = "slack:C1:T1",
    mode: str = "reply",
    history: Sequence[Mapping[str, str]] = ORIGIN_HISTORY,
    how: str = "activate",
) -> Claimed:
    """A whole interactive round: claim during the run, settle the origin, submit the result."""
    binding = service.begin_run(run_id, conversation_id, reply_to, mode)
    claimed = await producer.claim(binding, "task-" + run_id)
    await settle(binding, history, how)
    response = await producer.submit(claimed, payload)
    assert response.status_code == 200, response.text
    return claimed


async def wait_state(
    service: ContinuationService, cid: str, states: Sequence[str] = TERMINAL, timeout: float = 15.0
) -> Continuation:
    """Poll the in-memory record until it reaches one of ``states``."""
    with anyio.fail_after(timeout):
        while True:
            rec = service.repo.get(cid)
            if rec is not None and rec.state in states:
                return rec
            await anyio.sleep(0.01)


def payload_bytes(payload: Any) -> bytes:
    return msgspec.json.encode(payload, order="sorted")

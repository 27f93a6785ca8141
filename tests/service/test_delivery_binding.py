"""The claim binding is verified before every channel call, not only at synthesis (issue 13
item 3): a record whose bound fields were altered in the store after synthesis is
dead-lettered and nothing is posted to the altered destination.

The alteration is written through the store itself, standing in for an edit of the state
directory: the record keeps its original ``claim_mac``, exactly what an attacker without the
secret can produce.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from fakes.harness import make_config, running
from fakes.producer import wait_state

from afterword.app.service import ContinuationService
from afterword.continuations import Continuation
from afterword.continuations import lifecycle as lc
from afterword.worker import ChunkDelivery, ChunkReceipt
from afterword.worker.errors import RetryableDeliveryError

ROUTE = "slack:C_DAILY:T_1"  # the conversation of the named route daily-attention
EVIL = "slack:C_EVIL:T_9"


class Recording:
    """Refuses the first post retryably (nothing posted), then accepts; records every call."""

    max_chunk_chars = 4000

    def __init__(self, refuse_first: bool) -> None:
        self.refuse_first = refuse_first
        self.calls: list[ChunkDelivery] = []

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        self.calls.append(delivery)
        if self.refuse_first and len(self.calls) == 1:
            raise RetryableDeliveryError("rate_limited", "busy", 3600.0)  # far away: we alter first
        return ChunkReceipt(delivery_id=delivery.delivery_key, channel_id="test")


async def alter(service: ContinuationService, cid: str, **claim_changes: object) -> None:
    rec = service.repo.get(cid)
    assert rec is not None
    altered = msgspec.structs.replace(
        rec,
        claim=msgspec.structs.replace(rec.claim, **claim_changes),
        next_attempt_at_ms=service.clock_ms() if rec.state == "delivery_retry" else rec.next_attempt_at_ms,
    )
    await service.store.transact([service.repo.put(altered)], expect={"c/" + cid: service.repo.version(cid)})


@pytest.mark.anyio
@pytest.mark.parametrize(
    "changes",
    [{"reply_to": EVIL}, {"conversation_id": EVIL, "reply_to": EVIL}, {"mode": "capture"}],
    ids=["reply_to", "conversation", "mode"],
)
async def test_a_binding_altered_in_delivery_retry_is_dead_lettered_and_not_posted(
    tmp_path: Path, changes: dict[str, object]
) -> None:
    channel = Recording(refuse_first=True)
    config, env = make_config(tmp_path)
    async with running(config, env, channels={"*": channel}) as h:
        claimed = await h.producer.detached(config.base_url, "daily-attention", "task-1")
        await h.producer.submit(claimed, {"summary": "3 invoices need approval"})
        waiting = await wait_state(h.service, claimed.id, ("delivery_retry",))
        assert waiting.text is not None and len(channel.calls) == 1
        await alter(h.service, claimed.id, **changes)
        rec = await wait_state(h.service, claimed.id)
    assert rec.state == "dead_lettered"
    assert rec.last_error is not None and rec.last_error.code == "binding_invalid"
    assert [c.conversation_id for c in channel.calls] == [ROUTE]  # only the refused first try
    assert rec.receipt is None


@pytest.mark.anyio
async def test_a_binding_altered_in_ready_to_deliver_is_dead_lettered_after_a_restart(tmp_path: Path) -> None:
    channel = Recording(refuse_first=False)
    config, env = make_config(tmp_path)
    async with running(config, env, channels={"*": channel}, run_worker=False) as h:
        claimed = await h.producer.detached(config.base_url, "daily-attention", "task-2")
        await h.producer.submit(claimed, {"summary": "disk full"})
        now = h.service.clock_ms

        def synthesized(r: Continuation) -> Continuation:
            return lc.finish_synthesis(lc.begin_synthesis(r, now()), "An answer.", now())

        await h.service.transition(claimed.id, synthesized)
        await alter(h.service, claimed.id, reply_to=EVIL)
    async with running(config, env, channels={"*": channel}) as h:
        rec = await wait_state(h.service, claimed.id)
        await h.after_full_scan()
    assert rec.state == "dead_lettered"
    assert rec.last_error is not None and rec.last_error.code == "binding_invalid"
    assert channel.calls == []


@pytest.mark.anyio
async def test_an_intact_binding_still_delivers_after_a_retryable_refusal(tmp_path: Path) -> None:
    channel = Recording(refuse_first=True)
    config, env = make_config(tmp_path)
    async with running(config, env, channels={"*": channel}) as h:
        claimed = await h.producer.detached(config.base_url, "daily-attention", "task-3")
        await h.producer.submit(claimed, {"summary": "x"})
        await wait_state(h.service, claimed.id, ("delivery_retry",))
        await alter(h.service, claimed.id)  # nothing bound changes, only the schedule
        rec = await wait_state(h.service, claimed.id)
    assert rec.state == "delivered"
    assert [c.conversation_id for c in channel.calls] == [ROUTE, ROUTE]

"""Each confirmed chunk of a multi-message answer is durable before the next is posted."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from fakes.harness import make_config, running
from fakes.producer import reply_run

from afterword.continuations.model import decode_continuation
from afterword.worker.channels import ChunkDelivery, ChunkReceipt

pytestmark = pytest.mark.anyio


class SecondChunkHangs:
    max_chunk_chars = 10

    def __init__(self) -> None:
        self.posted: list[int] = []
        self.second_started = anyio.Event()

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        if delivery.chunk_index == 1:
            self.second_started.set()
            await anyio.sleep_forever()
        self.posted.append(delivery.chunk_index)
        return ChunkReceipt(delivery_id=f"native-{delivery.chunk_index}")


async def test_first_chunk_receipt_is_durable_before_the_second_post(tmp_path: Path) -> None:
    config, env = make_config(tmp_path, {"limits": {"deliveryTimeoutMs": 60000}})
    channel = SecondChunkHangs()
    async with running(config, env, channels={"*": channel}) as h:
        h.worker.drain_seconds = 0.2  # the second post never returns; do not wait on shutdown
        claimed = await reply_run(h.service, h.producer, {"summary": "a long answer " * 3})
        with anyio.fail_after(10):
            await channel.second_started.wait()
        stored = h.service.store.get("c/" + claimed.id)
        assert stored is not None
        rec = decode_continuation(stored.value)
        assert rec.delivery_in_flight and rec.chunk_receipts == ("native-0",)
        assert channel.posted == [0]

"""A store write refused in the middle of a multi-chunk post (ENOSPC while the first chunk's
receipt is recorded). The post may have happened, so it must never read as a channel failure:
the record stays durably in flight, nothing posts again in that process, and the next start
settles it the way it settles a crash (reconciled by a channel that can prove what it holds,
otherwise ``delivery_unknown`` / ``delivery_interrupted``). The crash simulator's lifecycle
workload found it (seed 1, ``truncate#2:ENOSPC:once`` with 16 KiB segments)."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.harness import make_config
from fakes.producer import Producer, reply_run

import afterword
from afterword.continuations.model import Continuation
from afterword.disk import StorageFullError
from afterword.store import StoreOptions, TransactionInfo
from afterword.worker import ChunkDelivery, ChunkReceipt, OutboxChannel, Worker

SUMMARY = " ".join(f"w{i:04d}" for i in range(1000))  # two chunks on either channel


class RefuseNextWrite:
    """The store hook: once armed, the next transaction is refused as a full disk refuses it
    (``StorageFullError``: nothing was written, the store stays writable)."""

    def __init__(self) -> None:
        self.armed = False
        self.refused = 0

    def __call__(self, info: TransactionInfo) -> None:
        if self.armed:
            self.armed = False
            self.refused += 1
            raise StorageFullError("wal/0000000002.seg", errno.ENOSPC)


class PlainChannel:
    """An embedded channel that cannot reconcile (like Slack or a webhook)."""

    max_chunk_chars = 4000

    def __init__(self, switch: RefuseNextWrite | None) -> None:
        self.switch = switch
        self.keys: list[str] = []

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        self.keys.append(delivery.delivery_key)
        if self.switch is not None and delivery.chunk_index == 0:
            self.switch.armed = True  # the write of this chunk's receipt is refused
        return ChunkReceipt(delivery_id=f"d-{delivery.delivery_key}", channel_id="plain")


class ArmingOutbox(OutboxChannel):
    def __init__(self, path: str, switch: RefuseNextWrite | None) -> None:
        super().__init__(path)
        self.switch = switch
        self.keys: list[str] = []

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        receipt = await super().post(delivery)
        self.keys.append(delivery.delivery_key)
        if self.switch is not None and delivery.chunk_index == 0:
            self.switch.armed = True
        return receipt


async def _session(
    config: Any, env: dict[str, str], channel: Any, switch: RefuseNextWrite | None, step: Any
) -> Any:
    options = StoreOptions(observe_transaction=switch) if switch is not None else None
    async with (
        afterword.open_service(
            config, channels={"*": channel}, environ=env, run_worker=False, store_options=options
        ) as service,
        httpx.AsyncClient(timeout=10) as client,
    ):
        worker: Worker = service.worker  # type: ignore[attr-defined]
        return await step(service, Producer(client), worker)


async def _drive(worker: Worker) -> None:
    for _ in range(6):  # synthesize, then deliver; bounded so a repost loop cannot hang
        if not await worker.run_due():
            return


@pytest.mark.anyio
@pytest.mark.parametrize("reconciles", [False, True], ids=["plain", "outbox"])
async def test_a_refused_receipt_write_mid_post_is_settled_like_a_crash(
    tmp_path: Path, reconciles: bool
) -> None:
    config, env = make_config(tmp_path)
    switch = RefuseNextWrite()
    outbox = str(tmp_path / "outbox.jsonl")
    first: Any = ArmingOutbox(outbox, switch) if reconciles else PlainChannel(switch)

    async def post_and_refuse(service: Any, producer: Producer, worker: Worker) -> tuple[str, Continuation]:
        claimed = await reply_run(service, producer, {"summary": SUMMARY})
        await _drive(worker)
        rec = service.repo.get(claimed.id)
        assert rec is not None
        await _drive(worker)  # nothing may post it again in this process
        return claimed.id, rec

    cid, live = await _session(config, env, first, switch, post_and_refuse)
    assert switch.refused == 1
    assert first.keys == [f"{cid}:0"]
    # Before the fix: delivery_unknown "delivery_error", a channel's code, and chunk 0's
    # receipt dropped; the outbox could then not settle it without an operator.
    assert (live.state, live.delivery_in_flight, live.last_error) == ("ready_to_deliver", True, None)

    second: Any = ArmingOutbox(outbox, None) if reconciles else PlainChannel(None)

    async def reopened(service: Any, producer: Producer, worker: Worker) -> Continuation:
        await _drive(worker)
        rec = service.repo.get(cid)
        return rec if rec is not None else service.repo.tombstone(cid)

    after = await _session(config, env, second, None, reopened)
    if reconciles:
        assert after.state == "delivered"
        # The outbox skips the chunk it holds: each chunk is in the file exactly once.
        assert [line["deliveryKey"] for line in afterword_outbox(outbox)] == [f"{cid}:0", f"{cid}:1"]
    else:
        assert after.state == "delivery_unknown"
        assert after.last_error is not None and after.last_error.code == "delivery_interrupted"
        assert second.keys == []  # never blindly reposted


def afterword_outbox(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


class FailsOnSecondChunk(PlainChannel):
    """An embedded adapter with a bug that shows only on the second chunk."""

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        if delivery.chunk_index == 1:
            raise KeyError("adapter bug")
        return await super().post(delivery)


@pytest.mark.anyio
async def test_an_unexpected_channel_error_after_a_posted_chunk_keeps_its_receipt(tmp_path: Path) -> None:
    config, env = make_config(tmp_path)
    channel = FailsOnSecondChunk(None)

    async def run(service: Any, producer: Producer, worker: Worker) -> Continuation:
        claimed = await reply_run(service, producer, {"summary": SUMMARY})
        await _drive(worker)
        rec = service.repo.get(claimed.id)
        assert rec is not None
        return rec

    rec = await _session(config, env, channel, None, run)
    assert len(channel.keys) == 1
    assert rec.state == "delivery_unknown" and rec.post_unproven
    # Before: the channel's generic "delivery_error", as if nothing had been posted.
    assert rec.chunk_receipts == (f"d-{channel.keys[0]}",)
    assert rec.last_error is not None and rec.last_error.code == "partial_delivery"

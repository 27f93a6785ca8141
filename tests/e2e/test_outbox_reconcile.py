"""An outbox delivery interrupted by a crash is reconciled, not declared unknown (issue 13
item 13). The outbox is afterword's own file and declares ``can_reconcile``: at the next start
each chunk's delivery key is looked up; all present is a delivery with those receipts, and
otherwise only the missing chunks are posted (the outbox skips a key it already holds).
Slack and webhook cannot reconcile (tests/e2e/test_worker_kill.py, tests/service/test_worker_recovery.py).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from _claims import make_claim
from _killhelpers import DetachedProducer, ServeProcess
from _service import ENV, load, outbox_lines, write_config
from fakes.harness import make_config, running
from fakes.producer import reply_run

from afterword.continuations import Continuation, InvalidTransition, ResultRecord
from afterword.continuations import lifecycle as lc
from afterword.worker import ChunkDelivery, OutboxChannel, SlackChannel, WebhookChannel
from afterword.worker.channels import can_reconcile, split_chunks

NOW = 1_900_000_000_000
ROUTE = "slack:C1:T1"  # served by the default "*" outbox in these configs


def long_text(words: int) -> str:
    return " ".join(f"w{i:05d}" for i in range(words))


def delivery(key: str, index: int = 0, count: int = 1, text: str = "hi") -> ChunkDelivery:
    return ChunkDelivery(
        delivery_key=key, conversation_id=ROUTE, chunk_index=index, chunk_count=count, text=text
    )


# -- the pure verdict ------------------------------------------------------------------------
def in_flight() -> Continuation:
    rec = Continuation(
        claim=make_claim(created_at_ms=NOW - 1000, deadline_ms=NOW + 3_600_000),
        claim_mac="m",
        state="ready_to_deliver",
        origin_context="pinned",
        result=ResultRecord(idempotency_key="r", payload_hash="a" * 64, payload=b"{}", received_at_ms=NOW),
        text="answer",
        completion_kind="synthesized",
    )
    return lc.begin_delivery(rec, NOW)


def test_every_chunk_found_is_a_delivery_with_those_receipts() -> None:
    rec = lc.reconcile(in_flight(), ["k:0", "k:1"], "outbox", NOW + 1)
    assert rec.state == "delivered" and not rec.post_unproven
    assert rec.receipt is not None and rec.receipt.delivery_ids == ("k:0", "k:1")
    assert rec.receipt.kind == "posted" and rec.receipt.channel_id == "outbox"


@pytest.mark.parametrize("found", [[None, None], ["k:0", None]], ids=["none", "first"])
def test_a_missing_chunk_resumes_at_once_without_doubt(found: list[str | None]) -> None:
    rec = lc.reconcile(in_flight(), found, "outbox", NOW + 1)
    assert rec.state == "delivery_retry" and rec.next_attempt_at_ms == NOW + 1
    assert not rec.delivery_in_flight and not rec.post_unproven and lc.may_post(rec)
    assert rec.last_error is not None and rec.last_error.code == "delivery_reconciled"
    assert rec.attempts.delivery == 1  # the interrupted attempt was already counted


def test_only_an_interrupted_delivery_is_reconciled() -> None:
    settled = lc.delivered(in_flight(), lc.Receipt(kind="posted", delivered_at_ms=NOW), NOW)
    for rec in (settled, msgspec.structs.replace(in_flight(), delivery_in_flight=False)):
        with pytest.raises(InvalidTransition):
            lc.reconcile(rec, ["k:0"], "outbox", NOW)


# -- the adapter -----------------------------------------------------------------------------
def test_only_the_outbox_declares_it_can_reconcile(tmp_path: Path) -> None:
    assert can_reconcile(OutboxChannel(str(tmp_path / "o.jsonl")))
    assert not can_reconcile(SlackChannel("http://127.0.0.1:9", "xoxb-not-real"))
    assert not can_reconcile(WebhookChannel("http://127.0.0.1:9/in"))
    assert not can_reconcile(object())  # an embedded adapter that says nothing cannot


@pytest.mark.anyio
async def test_the_outbox_is_exactly_once_per_key_and_answers_lookups(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    outbox = OutboxChannel(str(path))
    assert await outbox.lookup(["a:0"]) == {}  # no file yet
    first = await outbox.post(delivery("a:0"))
    again = await outbox.post(delivery("a:0"))
    assert first == again
    assert [line["deliveryKey"] for line in map(json.loads, path.read_text().splitlines())] == ["a:0"]
    # Another writer appended to the same file (two channel keys can share one outbox).
    await OutboxChannel(str(path)).post(delivery("b:0"))
    assert set(await outbox.lookup(["a:0", "b:0", "c:0"])) == {"a:0", "b:0"}
    # A torn, unconfirmed line proves nothing, and the next line does not stick to it.
    with open(path, "ab") as f:
        f.write(b'{"deliveryKey":"c:0","conv')
    assert set(await outbox.lookup(["c:0"])) == set()
    await outbox.post(delivery("c:0"))
    lines = path.read_bytes().split(b"\n")
    assert json.loads(lines[-2])["deliveryKey"] == "c:0"
    # Rotation: a new file under the same name is indexed afresh.
    os.replace(path, tmp_path / "outbox.1.jsonl")
    assert await outbox.lookup(["a:0"]) == {}
    await outbox.post(delivery("a:0"))
    assert [json.loads(x)["deliveryKey"] for x in path.read_text().splitlines()] == ["a:0"]


# -- a crash simulated in process ------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("posted_before_crash", [0, 1, "all"])
async def test_an_interrupted_outbox_delivery_is_finished_from_the_outbox(
    tmp_path: Path, posted_before_crash: int | str
) -> None:
    config, env = make_config(tmp_path)
    text = long_text(2000)
    chunks = split_chunks(text, OutboxChannel.max_chunk_chars)
    assert len(chunks) >= 3
    held = len(chunks) if posted_before_crash == "all" else int(posted_before_crash)
    async with running(config, env, run_worker=False) as h:
        claimed = await reply_run(h.service, h.producer, {"summary": "x"}, reply_to=ROUTE)
        now = h.service.clock_ms

        def to_in_flight(r: Continuation) -> Continuation:
            r = lc.finish_synthesis(lc.begin_synthesis(r, now()), text, now())
            return lc.begin_delivery(r, now())

        await h.service.transition(claimed.id, to_in_flight)
        outbox = OutboxChannel(os.path.join(config.config_dir, "outbox.jsonl"))
        for i in range(held):  # what the channel took before the process died
            await outbox.post(delivery(f"{claimed.id}:{i}", i, len(chunks), chunks[i]))
    async with running(config, env) as h2:
        with anyio.fail_after(15):
            # Settled during startup, so the startup retention pass may already have compacted it.
            while (
                rec := h2.service.repo.get(claimed.id) or h2.service.repo.tombstone(claimed.id)
            ) is None or (rec.state != "delivered"):
                await anyio.sleep(0.01)
    keys = [line["deliveryKey"] for line in outbox_lines(config)]
    expected = [f"{claimed.id}:{i}" for i in range(len(chunks))]
    assert rec.state == "delivered" and not rec.post_unproven
    assert keys == expected  # every chunk exactly once, in order
    assert "".join(line["text"] for line in outbox_lines(config)) == text
    assert rec.receipt is not None and list(rec.receipt.delivery_ids) == expected
    assert rec.attempts.delivery == (1 if held == len(chunks) else 2)


# -- a real crash ----------------------------------------------------------------------------
def test_sigkill_of_serve_mid_outbox_delivery_is_reconciled_after_restart(tmp_path: Path) -> None:
    """SIGKILL while a many-chunk answer is being appended to the outbox: after the restart
    the answer is complete, every chunk present exactly once, and the record delivered."""
    path = write_config(tmp_path)
    config = load(path)
    outbox = Path(config.config_dir) / "outbox.jsonl"
    summary = long_text(30_000)  # ~180 KB of text: about 45 chunks, each fsynced twice
    producer = DetachedProducer(config.base_url)
    server = ServeProcess(path, ENV, tmp_path / "serve.log")
    try:
        with server:
            claim = producer.claim("daily-attention", "big-1")
            producer.submit(claim, {"summary": summary})
            end = time.monotonic() + 30
            while not outbox.exists() or outbox.read_bytes().count(b"\n") < 2:
                assert time.monotonic() < end, "delivery never started"
                time.sleep(0.002)
            server.kill()
        at_kill = outbox_lines(config)
        chunk_count = at_kill[0]["chunkCount"]
        assert len(at_kill) < chunk_count, "the delivery finished before the kill; nothing was tested"
        with server:
            status = producer.wait_state(claim)
    finally:
        producer.close()
    lines = outbox_lines(config)
    counts = Counter(line["deliveryKey"] for line in lines)
    cid = claim["continuationId"]
    assert status["state"] == "delivered", status
    assert counts == Counter({f"{cid}:{i}": 1 for i in range(chunk_count)})
    assert status["receipt"]["deliveryIds"] == [f"{cid}:{i}" for i in range(chunk_count)]
    assert summary in "".join(line["text"] for line in lines)


@pytest.mark.anyio
async def test_a_reconciled_delivery_joins_the_history_before_it_is_committed_delivered(
    tmp_path: Path,
) -> None:
    """One commit, after the history append: a crash between the two can only leave the record
    in flight (reconciled again, the append being idempotent), never delivered without its
    answer in the history (found by the crash simulator's lifecycle-outbox workload)."""
    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        claimed = await reply_run(h.service, h.producer, {"summary": "x"}, reply_to=ROUTE)
        now = h.service.clock_ms
        await h.service.transition(
            claimed.id, lambda r: lc.synthesize_locally(r, "the answer", now(), start_delivery=True)
        )
        await OutboxChannel(os.path.join(config.config_dir, "outbox.jsonl")).post(
            delivery(f"{claimed.id}:0", 0, 1, "the answer")
        )
        events: list[tuple[str, ...]] = []
        h.service.on_change.append(
            lambda old, new: events.append(
                ("commit", new.state, str(new.receipt.history_recorded if new.receipt else None))
            )
        )
        history = h.worker.delivery.history
        assert history is not None
        real = history.append

        async def append(conversation_id: str, messages: Any) -> None:
            events.append(("append",))
            await real(conversation_id, messages)

        history.append = append  # type: ignore[method-assign]
        assert await h.worker.reconcile_interrupted() == 1
    assert events == [("append",), ("commit", "delivered", "True")]

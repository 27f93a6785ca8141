"""Startup recovery: safe pre-send work resumes; interrupted synthesis or delivery becomes a
non-replayed terminal state; an origin that never committed is abandoned (fixed answer)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from fakes.harness import Harness, make_config, running
from fakes.producer import reply_run, wait_state
from fakes.synth import RecordingSynth

from afterword.continuations import lifecycle
from afterword.continuations.model import Continuation
from afterword.worker import ChunkDelivery, ChunkReceipt

FALLBACK = (
    "The background task finished, but I could not safely restore the original conversation "
    "context. Please ask me to check the result again."
)


async def step(h: Harness, cid: str, fn: Callable[[Continuation, int], Continuation]) -> None:
    """Apply one lifecycle transition durably, as the worker would have before a crash."""
    now = h.service.clock_ms()
    await h.service.transition(cid, lambda r: fn(r, now))


@pytest.mark.anyio
async def test_a_result_accepted_while_no_worker_ran_is_synthesized_and_delivered_after_restart(
    tmp_path: Path,
) -> None:
    synth = RecordingSynth("resumed")
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth, run_worker=False) as h:
        claimed = await reply_run(h.service, h.producer, {"summary": "x"})
    async with running(config, env, synthesizer=synth) as h2:
        rec = await wait_state(h2.service, claimed.id)
    assert rec.state == "delivered"
    assert len(synth.calls) == 1
    assert [line["text"] for line in h.outbox()] == ["resumed"]


@pytest.mark.anyio
async def test_durable_text_is_delivered_after_restart_without_a_second_synthesis(tmp_path: Path) -> None:
    synth = RecordingSynth("fresh text")
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth, run_worker=False) as h:
        claimed = await reply_run(h.service, h.producer, {"summary": "x"})
        await step(h, claimed.id, lifecycle.begin_synthesis)
        await step(h, claimed.id, lambda r, now: lifecycle.finish_synthesis(r, "persisted text", now))
    async with running(config, env, synthesizer=synth) as h2:
        rec = await wait_state(h2.service, claimed.id)
    assert rec.state == "delivered"
    assert synth.calls == []
    assert [line["text"] for line in h.outbox()] == ["persisted text"]


class Unprovable:
    """A channel that cannot say what it holds (like Slack or a webhook): no can_reconcile.
    The outbox can, and its interrupted deliveries are settled by tests/e2e/test_outbox_reconcile.py."""

    max_chunk_chars = 4000

    def __init__(self) -> None:
        self.posts: list[ChunkDelivery] = []

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        self.posts.append(delivery)
        return ChunkReceipt(delivery_id=delivery.delivery_key)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("crash_point", "state", "code"),
    [
        ("synthesizing", "dead_lettered", "synthesis_interrupted"),
        ("in_flight", "delivery_unknown", "delivery_interrupted"),
        ("chunk_posted", "delivery_unknown", "delivery_interrupted"),
    ],
)
async def test_interrupted_work_is_not_replayed_after_restart(
    tmp_path: Path, crash_point: str, state: str, code: str
) -> None:
    synth = RecordingSynth("text")
    channel = Unprovable()
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth, run_worker=False, channels={"*": channel}) as h:
        claimed = await reply_run(h.service, h.producer, {"summary": "x"})
        await step(h, claimed.id, lifecycle.begin_synthesis)
        if crash_point != "synthesizing":
            await step(h, claimed.id, lambda r, now: lifecycle.finish_synthesis(r, "text", now))
            await step(h, claimed.id, lifecycle.begin_delivery)
        if crash_point == "chunk_posted":
            # Even with the in-flight mark lost, a recorded chunk receipt proves posting began.
            await step(
                h,
                claimed.id,
                lambda r, now: msgspec.structs.replace(
                    lifecycle.record_chunk(r, "ts-1", now), delivery_in_flight=False
                ),
            )
    async with running(config, env, synthesizer=synth, channels={"*": channel}) as h2:
        await h2.after_full_scan()
        rec = h2.service.repo.get(claimed.id)
        health = h2.service.continuation_health().status
    assert rec is not None and rec.state == state
    assert rec.last_error is not None and rec.last_error.code == code
    assert health == "unhealthy"
    assert synth.calls == [] and channel.posts == []


@pytest.mark.anyio
async def test_an_origin_that_never_committed_is_abandoned_at_restart(tmp_path: Path) -> None:
    synth = RecordingSynth()
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        binding = h.service.begin_run("run-1", "slack:C1:T1#2030-01-01", "slack:C1:T1")
        claimed = await h.producer.claim(binding, "task-1")
        await binding.close()
        await binding.finalize([{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}])
        # The host dies here: finalized but never activated. The early result stays deferred.
        assert (await h.producer.submit(claimed, {"summary": "x"})).json()["deferred"] is True
        await h.after_full_scan()
        assert synth.calls == [] and h.outbox() == []
    async with running(config, env, synthesizer=synth) as h2:
        rec = await wait_state(h2.service, claimed.id)
    assert rec.origin_context == "abandoned"
    assert rec.state == "delivered" and rec.completion_kind == "origin_context_unavailable"
    assert synth.calls == []
    assert [line["text"] for line in h.outbox()] == [FALLBACK]

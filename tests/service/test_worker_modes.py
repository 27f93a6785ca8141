"""Delivery modes: notify_if_actionable, capture and silent, detached and interactive."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes.harness import make_config, running
from fakes.producer import reply_run, settle, wait_state
from fakes.synth import RecordingSynth

BUCKET = "slack:C1:T1#2030-01-01"


@pytest.mark.anyio
async def test_detached_non_actionable_notification_is_suppressed_without_synthesis(tmp_path: Path) -> None:
    synth = RecordingSynth()
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        quiet = await h.producer.detached(h.service.base_url, "daily-attention", "daily-quiet")
        assert (
            await h.producer.submit(quiet, {"actionable": False, "summary": "all clear"})
        ).status_code == 200
        await wait_state(h.service, quiet.id)
        status = await h.producer.status(quiet)
        loud = await h.producer.detached(h.service.base_url, "daily-attention", "daily-loud")
        assert (
            await h.producer.submit(loud, {"actionable": True, "summary": "disk full"})
        ).status_code == 200
        await wait_state(h.service, loud.id)
    assert status["state"] == "delivered"
    assert status["completionKind"] == "suppressed"
    assert status["receipt"]["kind"] == "suppressed" and status["receipt"]["deliveryIds"] == []
    assert status["attempts"] == {"synthesis": 0, "delivery": 0}
    # Only the actionable one reached the model and the channel.
    assert [c.payload for c in synth.calls] == [{"actionable": True, "summary": "disk full"}]
    assert [line["deliveryKey"] for line in h.outbox()] == [f"{loud.id}:0"]


@pytest.mark.anyio
async def test_interactive_notify_if_actionable_is_suppressed_when_not_actionable(tmp_path: Path) -> None:
    synth = RecordingSynth()
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        claimed = await reply_run(h.service, h.producer, {"actionable": False}, mode="notify_if_actionable")
        rec = await wait_state(h.service, claimed.id)
    assert rec.state == "delivered" and rec.completion_kind == "suppressed"
    assert rec.receipt is not None and rec.receipt.kind == "suppressed"
    assert synth.calls == [] and h.outbox() == []


@pytest.mark.anyio
async def test_silent_routes_are_delivered_without_synthesis_or_post(tmp_path: Path) -> None:
    synth = RecordingSynth()
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        detached = await h.producer.detached(h.service.base_url, "background-index", "index-1")
        assert (await h.producer.submit(detached, {"summary": "indexed"})).status_code == 200
        await wait_state(h.service, detached.id)
        status = await h.producer.status(detached)
        # Interactive silent work still waits for its origin to settle before it completes.
        binding = h.service.begin_run("run-1", BUCKET, None, "silent")
        claimed = await h.producer.claim(binding, "silent-1")
        assert (await h.producer.submit(claimed, {"summary": "x"})).json()["deferred"] is True
        assert h.service.repo.get(claimed.id).state == "result_received"  # type: ignore[union-attr]
        await settle(binding)
        interactive = await wait_state(h.service, claimed.id)
    assert status["state"] == "delivered" and status["completionKind"] == "silent"
    assert status["receipt"]["kind"] == "silent"
    assert interactive.state == "delivered" and interactive.completion_kind == "silent"
    assert synth.calls == [] and h.outbox() == []


@pytest.mark.anyio
async def test_capture_keeps_the_text_readable_only_through_the_app_handle(tmp_path: Path) -> None:
    synth = RecordingSynth("Verified: 3 of 3 checks pass.")
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        detached = await h.producer.detached(h.service.base_url, "verification", "verify-1")
        assert (await h.producer.submit(detached, {"summary": "3/3"})).status_code == 200
        await wait_state(h.service, detached.id)
        interactive = await reply_run(
            h.service, h.producer, {"summary": "3/3"}, mode="capture", reply_to=None
        )
        await wait_state(h.service, interactive.id)
        reply = await reply_run(h.service, h.producer, {"summary": "posted"}, run_id="run-2")
        await wait_state(h.service, reply.id)
        status = await h.producer.status(detached)
        texts = [h.service.captured_continuation_text(c.id) for c in (detached, interactive, reply)]
    assert status["state"] == "delivered" and status["receipt"]["kind"] == "captured"
    assert "text" not in status  # the wire never carries synthesized text
    assert texts == ["Verified: 3 of 3 checks pass.", "Verified: 3 of 3 checks pass.", None]
    assert [c.conversation_id for c in synth.calls] == ["local:verify", BUCKET, BUCKET]
    assert [line["deliveryKey"] for line in h.outbox()] == [f"{reply.id}:0"]  # only the reply posted

"""Origin context at synthesis: unavailable context takes the fixed zero-model answer, while an
altered claim or snapshot binding is dead-lettered with nothing delivered."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
from fakes.harness import Harness, make_config, running
from fakes.producer import settle, wait_state
from fakes.synth import RecordingSynth

from afterword.continuations.errors import Conflict
from afterword.continuations.model import Continuation

# Spelled out (not imported) so a changed constant fails here.
FALLBACK = (
    "The background task finished, but I could not safely restore the original conversation "
    "context. Please ask me to check the result again."
)
BUCKET = "slack:C1:T1#2030-01-01"
ROUTE = "slack:C1:T1"


async def rewrite(h: Harness, cid: str, change: Callable[[Continuation], Continuation]) -> None:
    """Replace a stored record through the store itself, as an attacker with disk access could."""
    rec = h.service.repo.get(cid)
    assert rec is not None
    await h.service.store.transact(
        [h.service.repo.put(change(rec))], expect={"c/" + cid: h.service.repo.version(cid)}
    )


def blob_path(h: Harness, cid: str) -> Path:
    rec = h.service.repo.get(cid)
    assert rec is not None and rec.snapshot_digest is not None
    return Path(h.config.state_dir) / "blobs" / rec.snapshot_digest


async def corrupt_blob(h: Harness, cid: str) -> None:
    path = blob_path(h, cid)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(data), 0)
    finally:
        os.close(fd)


async def remove_blob(h: Harness, cid: str) -> None:
    os.unlink(blob_path(h, cid))


async def legacy(h: Harness, cid: str) -> None:
    # A migrated record: no snapshot, explicitly classified; its claim MAC stays authentic.
    await rewrite(
        h,
        cid,
        lambda r: msgspec.structs.replace(
            r, origin_context="legacy_missing", snapshot_digest=None, snapshot_mac=None
        ),
    )


async def nothing(h: Harness, cid: str) -> None:
    return None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("how", "damage", "origin"),
    [
        ("abandon", nothing, "abandoned"),
        ("activate", corrupt_blob, "pinned"),
        ("activate", remove_blob, "pinned"),
        ("activate", legacy, "legacy_missing"),
    ],
    ids=["abandoned", "corrupt-blob", "missing-blob", "legacy-missing"],
)
async def test_unavailable_origin_context_delivers_the_fixed_answer_without_a_model_call(
    tmp_path: Path, how: str, damage: Callable[[Harness, str], Awaitable[None]], origin: str
) -> None:
    synth = RecordingSynth()
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        binding = h.service.begin_run("run-1", BUCKET, ROUTE)
        claimed = await h.producer.claim(binding, "task-1")
        await settle(binding, how=how)
        await damage(h, claimed.id)
        assert (await h.producer.submit(claimed, {"summary": "done"})).status_code == 200
        rec = await wait_state(h.service, claimed.id)
        status = await h.producer.status(claimed)
    assert synth.calls == []
    assert rec.state == "delivered"
    assert status["completionKind"] == "origin_context_unavailable"
    assert status["originContext"] == origin
    assert status["attempts"]["synthesis"] == 0
    [line] = h.outbox()
    assert line["text"] == FALLBACK
    assert line["conversationId"] == ROUTE


@pytest.mark.anyio
async def test_pending_origin_holds_the_result_until_activation(tmp_path: Path) -> None:
    synth = RecordingSynth("answer")
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        binding = h.service.begin_run("run-1", BUCKET, ROUTE)
        claimed = await h.producer.claim(binding, "task-1")
        body = (await h.producer.submit(claimed, {"summary": "early"})).json()
        assert (body["state"], body["deferred"], body["originContext"]) == (
            "result_received",
            True,
            "pending",
        )
        await binding.close()
        await binding.finalize([{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}])
        assert h.service.repo.get(claimed.id).state == "result_received"  # type: ignore[union-attr]
        assert synth.calls == [] and h.outbox() == []
        await binding.activate()
        rec = await wait_state(h.service, claimed.id)
    assert rec.state == "delivered" and len(synth.calls) == 1


def _claim_rerouted(r: Continuation) -> Continuation:
    # The stored claim now points somewhere else, but keeps the MAC of the original claim.
    return msgspec.structs.replace(r, claim=msgspec.structs.replace(r.claim, reply_to="slack:C_EVIL:T9"))


def _snapshot_rebound(r: Continuation) -> Continuation:
    assert r.snapshot_mac is not None
    flipped = ("0" if r.snapshot_mac[0] != "0" else "1") + r.snapshot_mac[1:]
    return msgspec.structs.replace(r, snapshot_mac=flipped)


def _mode_changed(r: Continuation) -> Continuation:
    return msgspec.structs.replace(r, claim=msgspec.structs.replace(r.claim, mode="silent"))


def _digest_malformed(r: Continuation) -> Continuation:
    # Not even a digest: must be refused like any other broken binding, not crash the worker.
    return msgspec.structs.replace(r, snapshot_digest="zz" * 32)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "tamper",
    [_claim_rerouted, _snapshot_rebound, _mode_changed, _digest_malformed],
    ids=["reply-to", "snapshot-mac", "mode", "malformed-digest"],
)
async def test_altered_binding_is_dead_lettered_and_nothing_is_delivered(
    tmp_path: Path, tamper: Callable[[Continuation], Continuation]
) -> None:
    synth = RecordingSynth()
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        binding = h.service.begin_run("run-1", BUCKET, ROUTE)
        claimed = await h.producer.claim(binding, "task-1")
        await settle(binding)
        await rewrite(h, claimed.id, tamper)
        assert (await h.producer.submit(claimed, {"summary": "done"})).status_code == 200
        rec = await wait_state(h.service, claimed.id)
        with pytest.raises(Conflict):
            await h.service.retry_continuation(claimed.id, allow_unknown=True)
    assert rec.state == "dead_lettered"
    assert rec.last_error is not None and rec.last_error.code == "binding_invalid"
    assert rec.text is None and rec.receipt is None
    assert synth.calls == []
    assert h.outbox() == []


@pytest.mark.anyio
async def test_capture_with_an_abandoned_origin_keeps_the_fixed_answer_and_posts_nothing(
    tmp_path: Path,
) -> None:
    synth = RecordingSynth()
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        binding = h.service.begin_run("run-1", BUCKET, None, "capture")
        claimed = await h.producer.claim(binding, "task-1")
        await settle(binding, how="abandon")
        assert (await h.producer.submit(claimed, {"summary": "done"})).status_code == 200
        rec = await wait_state(h.service, claimed.id)
        text = h.service.captured_continuation_text(claimed.id)
    assert rec.state == "delivered" and rec.completion_kind == "origin_context_unavailable"
    assert rec.receipt is not None and rec.receipt.kind == "captured"
    assert text == FALLBACK
    assert synth.calls == [] and h.outbox() == []

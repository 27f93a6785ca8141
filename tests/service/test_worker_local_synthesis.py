"""A local synthesizer (the template) commits its answer in one step from ``result_received``;
a remote one still commits ``synthesizing`` before it is called (continuations.actions.synthesis_plan).

What the fold must keep: the state history and attempt counts an operator reads, a failure
still dead-lettered once, and a stop during a local run leaving the record to be synthesized
again (nothing outside the process saw the lost run) instead of dead-lettering it.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from fakes.harness import Harness, make_config, running
from fakes.producer import reply_run, wait_state
from fakes.synth import RecordingSynth

from afterword.continuations.model import Continuation
from afterword.history import Message
from afterword.worker import ChunkDelivery, ChunkReceipt, SynthesisRequest, TemplateSynthesizer
from afterword.worker.synthesizers import is_local


def test_only_the_template_and_declared_synthesizers_are_local() -> None:
    assert is_local(TemplateSynthesizer())
    assert not is_local(RecordingSynth())
    assert is_local(RecordingSynth(local=True))


class PlainChannel:
    """A channel that cannot reconcile (as Slack and webhooks cannot)."""

    max_chunk_chars = 4000

    def __init__(self) -> None:
        self.posts: list[ChunkDelivery] = []

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        self.posts.append(delivery)
        return ChunkReceipt(delivery_id="m-" + delivery.delivery_key, channel_id="plain")


def _watch(h: Harness) -> list[tuple[str, bool]]:
    """(state, in flight) of every commit after the result was accepted."""
    committed: list[tuple[str, bool]] = []

    def seen(old: Continuation | None, new: Continuation) -> None:
        if old is not None and old.state != "claimed":
            committed.append((new.state, new.delivery_in_flight))

    h.service.on_change.append(seen)
    return committed


@pytest.mark.anyio
async def test_a_template_answer_and_its_outbox_delivery_start_are_one_commit(tmp_path: Path) -> None:
    config, env = make_config(tmp_path)
    async with running(config, env) as h:
        committed = _watch(h)
        claimed = await reply_run(h.service, h.producer, {"summary": "Indexed 42 files"})
        rec = await wait_state(h.service, claimed.id)
        status = await h.producer.status(claimed)
    # result_received -> (answer + in flight) -> delivered: the outbox can reconcile a crash.
    assert committed == [("ready_to_deliver", True), ("delivered", False)]
    assert [c.state for c in rec.history] == ["claimed", "result_received", "ready_to_deliver", "delivered"]
    assert status["attempts"] == {"synthesis": 1, "delivery": 1}
    assert status["completionKind"] == "synthesized"
    [line] = h.outbox()
    assert line["text"] == "Update on your earlier request: Indexed 42 files"


@pytest.mark.anyio
async def test_on_a_channel_that_cannot_reconcile_the_answer_is_committed_before_the_in_flight_mark(
    tmp_path: Path,
) -> None:
    channel = PlainChannel()
    config, env = make_config(tmp_path)
    async with running(config, env, channels={"*": channel}) as h:
        committed = _watch(h)
        claimed = await reply_run(h.service, h.producer, {"summary": "x"})
        rec = await wait_state(h.service, claimed.id)
    assert committed == [("ready_to_deliver", False), ("ready_to_deliver", True), ("delivered", False)]
    assert rec.state == "delivered" and rec.attempts.synthesis == 1 and len(channel.posts) == 1


@pytest.mark.anyio
async def test_a_captured_template_answer_is_committed_then_captured(tmp_path: Path) -> None:
    config, env = make_config(tmp_path)
    async with running(config, env) as h:
        committed = _watch(h)
        claimed = await h.producer.detached(h.service.base_url, "verification", "verify-1")
        await h.producer.submit(claimed, {"summary": "checked"})
        rec = await wait_state(h.service, claimed.id)
    assert committed == [("ready_to_deliver", False), ("delivered", False)]
    assert rec.receipt is not None and rec.receipt.kind == "captured" and h.outbox() == []


@pytest.mark.anyio
@pytest.mark.parametrize(("local", "durable_at_call"), [(False, "synthesizing"), (True, "result_received")])
async def test_what_is_durable_when_the_synthesizer_is_called(
    tmp_path: Path, local: bool, durable_at_call: str
) -> None:
    synth = RecordingSynth("answer", local=local)
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        states: list[str] = []

        def at_call(request: SynthesisRequest) -> None:
            rec = h.service.repo.get(request.continuation_id)
            assert rec is not None
            states.append(rec.state)

        synth.on_call = at_call
        claimed = await reply_run(h.service, h.producer, {"summary": "x"})
        rec = await wait_state(h.service, claimed.id)
    assert states == [durable_at_call]
    assert rec.state == "delivered" and rec.attempts.synthesis == 1
    assert ("synthesizing" in [c.state for c in rec.history]) is not local


@pytest.mark.anyio
async def test_a_failing_local_synthesizer_is_dead_lettered_once_with_its_attempt_counted(
    tmp_path: Path,
) -> None:
    synth = RecordingSynth(error=RuntimeError("template bug"), local=True)
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        claimed = await reply_run(h.service, h.producer, {"summary": "x"})
        rec = await wait_state(h.service, claimed.id)
    assert rec.state == "dead_lettered"
    assert rec.last_error is not None and rec.last_error.code == "synthesis_failed"
    assert rec.attempts.synthesis == 1 and len(synth.calls) == 1
    assert [c.state for c in rec.history] == ["claimed", "result_received", "dead_lettered"]
    assert h.outbox() == []


@pytest.mark.anyio
async def test_a_stop_during_a_local_synthesis_leaves_it_to_run_again_after_restart(tmp_path: Path) -> None:
    synth = RecordingSynth("answer", hang=True, local=True)
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        h.service.worker.drain_seconds = 0.2  # the drain bound, shortened for the test
        claimed = await reply_run(h.service, h.producer, {"summary": "x"})
        with anyio.fail_after(10):
            while not synth.calls:  # the synthesizer is running, and hangs
                await anyio.sleep(0.01)
    stopped = h.service.repo.get(claimed.id)
    assert stopped is not None and stopped.state == "result_received" and stopped.attempts.synthesis == 0
    again = RecordingSynth("answer", local=True)
    async with running(config, env, synthesizer=again) as h2:
        rec = await wait_state(h2.service, claimed.id)
    assert rec.state == "delivered" and rec.attempts.synthesis == 1
    assert len(again.calls) == 1
    assert [line["deliveryKey"] for line in h2.outbox()] == [f"{claimed.id}:0"]


@pytest.mark.anyio
@pytest.mark.parametrize("template", [True, False])
async def test_a_detached_route_history_is_read_only_for_a_synthesizer_that_reads_context(
    tmp_path: Path, template: bool
) -> None:
    synth = None if template else RecordingSynth("answer")
    config, env = make_config(tmp_path)
    reads: list[str] = []
    async with running(config, env, synthesizer=synth) as h:
        history = h.worker.synthesis.history
        assert history is not None
        real = history.latest

        async def latest(conversation_id: str, limit: int) -> list[Message]:
            reads.append(conversation_id)
            return await real(conversation_id, limit)

        history.latest = latest  # type: ignore[method-assign]
        claimed = await h.producer.detached(h.service.base_url, "daily-attention", "daily-1")
        await h.producer.submit(claimed, {"summary": "2 certificates expire", "actionable": True})
        rec = await wait_state(h.service, claimed.id)
    assert rec.state == "delivered"
    assert len(reads) == (0 if template else 1)

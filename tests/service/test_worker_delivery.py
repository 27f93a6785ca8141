"""Delivery: Slack and webhook adapters against local fakes, receipts, chunking, retries with
backoff, permanent refusals, timeouts, partial answers, allowlists, history and expiry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from fakes import HANG, Clock, FakeSlack, FakeWebhook, Reply
from fakes.harness import make_config, running
from fakes.producer import reply_run, wait_state
from fakes.synth import ExplodingHistory, HangingHistory, RecordingSynth

from afterword.continuations.errors import Conflict, InvalidTransition
from afterword.continuations.lifecycle import backoff_ms
from afterword.worker import ChunkDelivery, ChunkReceipt, OutboxChannel

SLACK_TOKEN = "xoxb-test-token-not-real"
ENV = {"AFTERWORD_TEST_SLACK_TOKEN": SLACK_TOKEN}
ROUTE = "slack:C1:T1"
HOOK = "hook:alerts"


def slack_block(fake: FakeSlack, allow: list[str] | None = None, **limits: int) -> dict[str, Any]:
    slack: dict[str, Any] = {
        "adapter": "slack",
        "baseUrl": fake.url,
        "tokenEnv": "AFTERWORD_TEST_SLACK_TOKEN",
    }
    if allow is not None:
        slack["allow"] = allow
    block: dict[str, Any] = {"channels": {"slack": slack, "*": {"adapter": "outbox"}}}
    if limits:
        block["limits"] = limits
    return block


def hook_block(fake: FakeWebhook, **limits: int) -> dict[str, Any]:
    block: dict[str, Any] = {
        "channels": {
            "hook": {"adapter": "webhook", "url": fake.url + "/deliver", "headers": {"X-Team": "blue"}},
            "*": {"adapter": "outbox"},
        }
    }
    if limits:
        block["limits"] = limits
    return block


def long_summary(words: int = 1000) -> str:
    return " ".join(f"w{i:04d}" for i in range(words))


@pytest.mark.anyio
async def test_slack_posts_into_the_bound_thread_and_keeps_its_receipt(tmp_path: Path) -> None:
    with FakeSlack(SLACK_TOKEN) as fake:
        config, env = make_config(tmp_path, slack_block(fake), ENV)
        async with running(config, env) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "done"}, reply_to=ROUTE)
            await wait_state(h.service, claimed.id)
            status = await h.producer.status(claimed)
        [post] = fake.posts
    assert post == {"channel": "C1", "thread_ts": "T1", "text": "Update on your earlier request: done"}
    assert status["state"] == "delivered"
    receipt = status["receipt"]
    assert receipt["kind"] == "posted" and receipt["channelId"] == "C1"
    assert receipt["deliveryIds"] == ["1700000000.000001"]
    assert receipt["historyRecorded"] is True and receipt["historyErrorCode"] is None
    assert h.outbox() == []  # no fallback delivery alongside the real channel


@pytest.mark.anyio
async def test_webhook_posts_with_a_stable_idempotency_key(tmp_path: Path) -> None:
    with FakeWebhook() as fake:
        config, env = make_config(tmp_path, hook_block(fake))
        async with running(config, env) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "done"}, reply_to=HOOK)
            rec = await wait_state(h.service, claimed.id)
        [request] = fake.requests
    assert request.path == "/deliver"
    assert request.headers["idempotency-key"] == f"{claimed.id}:0"
    assert request.headers["x-team"] == "blue"
    assert request.json() == {
        "deliveryKey": f"{claimed.id}:0",
        "conversationId": HOOK,
        "chunkIndex": 0,
        "chunkCount": 1,
        "text": "Update on your earlier request: done",
    }
    assert rec.receipt is not None
    assert (rec.receipt.channel_id, rec.receipt.delivery_ids) == ("webhook", ("wh-1",))


@pytest.mark.anyio
async def test_long_answers_are_split_and_every_chunk_needs_a_receipt(tmp_path: Path) -> None:
    summary = long_summary()
    with FakeSlack(SLACK_TOKEN) as fake:
        config, env = make_config(tmp_path, slack_block(fake), ENV)
        async with running(config, env) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": summary})
            rec = await wait_state(h.service, claimed.id)
        posts = fake.posts
    assert rec.state == "delivered"
    assert len(posts) == 2
    assert all(p["thread_ts"] == "T1" and len(p["text"]) <= 3500 for p in posts)
    assert "".join(p["text"] for p in posts) == "Update on your earlier request: " + summary
    assert rec.receipt is not None
    assert rec.receipt.delivery_ids == ("1700000000.000001", "1700000000.000002")


@pytest.mark.anyio
@pytest.mark.parametrize("failure", [FakeSlack.server_error(), FakeSlack.refuse()], ids=["5xx", "refused"])
async def test_a_partial_answer_is_delivery_unknown_with_its_chunk_receipts(
    tmp_path: Path, failure: Reply
) -> None:
    with FakeSlack(SLACK_TOKEN) as fake:
        fake.chunk_two_fails(failure)
        config, env = make_config(tmp_path, slack_block(fake), ENV)
        async with running(config, env) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": long_summary()})
            rec = await wait_state(h.service, claimed.id)
            status = await h.producer.status(claimed)
            with pytest.raises(Conflict):
                await h.service.retry_continuation(claimed.id)  # never blindly reposted
            assert h.service.continuation_health().status == "unhealthy"
        assert fake.count == 2
    assert rec.state == "delivery_unknown"
    assert rec.chunk_receipts == ("1700000000.000001",)
    assert status["lastError"]["code"] == "partial_delivery"
    assert status["receipt"] is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    "answer",
    [
        Reply(200, {"ok": True, "channel": "C1"}),
        Reply(200, b"<html>proxy</html>", {"Content-Type": "text/html"}),
    ],
    ids=["ok-without-ts", "2xx-not-json"],
)
async def test_an_unconfirmed_slack_success_is_delivery_unknown_not_retried(
    tmp_path: Path, answer: Reply
) -> None:
    with FakeSlack(SLACK_TOKEN) as fake:
        fake.script(answer)
        config, env = make_config(tmp_path, slack_block(fake), ENV)
        async with running(config, env) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "done"})
            rec = await wait_state(h.service, claimed.id)
        assert fake.count == 1
    assert rec.state == "delivery_unknown"
    assert rec.last_error is not None and rec.last_error.code == "delivery_error"


@pytest.mark.anyio
async def test_a_retryable_failure_is_retried_after_backoff_then_delivered(tmp_path: Path) -> None:
    # A webhook 5xx is retried with the same Idempotency-Key (a Slack 5xx is an unknown
    # outcome instead: tests/service/test_channel_outcomes.py).
    clock = Clock()
    with FakeWebhook() as fake:
        fake.script(FakeWebhook.server_error(502))
        config, env = make_config(tmp_path, hook_block(fake))
        async with running(config, env, clock=clock) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "done"}, reply_to=HOOK)
            waiting = await wait_state(h.service, claimed.id, ["delivery_retry"])
            assert waiting.last_error is not None and waiting.last_error.code == "http_502"
            assert waiting.next_attempt_at_ms is not None and not waiting.delivery_in_flight
            clock.advance(600_000)
            await wait_state(h.service, claimed.id)
            status = await h.producer.status(claimed)
        assert fake.count == 2
    assert status["state"] == "delivered"
    assert status["attempts"] == {"synthesis": 1, "delivery": 2}
    assert status["lastError"] is None


@pytest.mark.anyio
async def test_rate_limit_retry_after_is_respected(tmp_path: Path) -> None:
    clock = Clock(frozen=True)
    with FakeWebhook() as fake:
        fake.script(FakeWebhook.rate_limited(120))
        config, env = make_config(tmp_path, hook_block(fake))
        async with running(config, env, clock=clock) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "done"}, reply_to=HOOK)
            waiting = await wait_state(h.service, claimed.id, ["delivery_retry"])
            assert waiting.next_attempt_at_ms is not None
            assert waiting.next_attempt_at_ms >= clock() + 120_000
            clock.advance(60_000)
            await h.after_full_scan()  # the worker looked at it and found the retry not yet due
            assert fake.count == 1
            assert h.service.repo.get(claimed.id).state == "delivery_retry"  # type: ignore[union-attr]
            clock.advance(61_000)
            rec = await wait_state(h.service, claimed.id)
        assert fake.count == 2
    assert rec.state == "delivered" and rec.attempts.delivery == 2


@pytest.mark.anyio
@pytest.mark.parametrize("adapter", ["slack", "webhook"])
async def test_a_permanent_refusal_is_dead_lettered_at_once(tmp_path: Path, adapter: str) -> None:
    fake: FakeSlack | FakeWebhook = FakeSlack(SLACK_TOKEN) if adapter == "slack" else FakeWebhook()
    with fake:
        fake.always(fake.refuse())
        block = slack_block(fake) if isinstance(fake, FakeSlack) else hook_block(fake)
        config, env = make_config(tmp_path, block, ENV)
        async with running(config, env) as h:
            claimed = await reply_run(
                h.service, h.producer, {"summary": "x"}, reply_to=ROUTE if adapter == "slack" else HOOK
            )
            rec = await wait_state(h.service, claimed.id)
        assert fake.count == 1
    assert rec.state == "dead_lettered"
    assert rec.attempts.delivery == 1
    assert rec.last_error is not None
    assert rec.last_error.code == ("channel_not_found" if adapter == "slack" else "http_403")
    assert h.outbox() == []  # no fallback to another destination


@pytest.mark.anyio
async def test_twenty_retryable_failures_dead_letter_with_bounded_exponential_backoff(tmp_path: Path) -> None:
    clock = Clock(frozen=True)
    with FakeWebhook() as fake:
        fake.always(FakeWebhook.server_error())
        config, env = make_config(tmp_path, hook_block(fake))
        async with running(config, env, clock=clock, run_worker=False) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "x"}, reply_to=HOOK)
            delays = []
            await h.worker.synthesize(claimed.id)  # synthesizes, then makes delivery attempt 1
            while (rec := h.service.repo.get(claimed.id)) is not None and rec.state == "delivery_retry":
                assert rec.next_attempt_at_ms is not None
                delays.append(rec.next_attempt_at_ms - clock())
                clock.advance(rec.next_attempt_at_ms - clock())
                await h.worker.deliver(claimed.id)
        assert fake.count == 20
    assert rec is not None and rec.state == "dead_lettered"
    assert rec.attempts.delivery == 20
    assert rec.last_error is not None and rec.last_error.code == "retries_exhausted"
    assert len(delays) == 19
    for attempt, delay in enumerate(delays, start=1):
        step = min(300_000, 1000 * 2 ** (attempt - 1))
        assert step // 2 <= delay <= step, (attempt, delay)
    assert backoff_ms(30, 0.999) <= 300_000


@pytest.mark.anyio
async def test_a_delivery_timeout_is_delivery_unknown_and_not_reposted(tmp_path: Path) -> None:
    with FakeWebhook() as fake:
        fake.always(HANG)
        # 1 s, not less: on a loaded machine a shorter bound can fire before the post arrives.
        config, env = make_config(tmp_path, hook_block(fake, deliveryTimeoutMs=1000))
        async with running(config, env) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "x"}, reply_to=HOOK)
            rec = await wait_state(h.service, claimed.id)
            await h.after_full_scan()  # a (wrong) second post would have been sent by now
        assert fake.count == 1
    assert rec.state == "delivery_unknown"
    assert rec.last_error is not None and rec.last_error.code == "delivery_timeout"


@pytest.mark.anyio
async def test_an_operator_verdict_on_an_unknown_post_never_reposts_by_itself(tmp_path: Path) -> None:
    """`resolve not_delivered` holds the answer for an explicit retry, and `resolve delivered`
    ends it: in neither case does the running worker post again on its own."""
    with FakeWebhook() as fake:
        fake.always(HANG)
        config, env = make_config(tmp_path, hook_block(fake, deliveryTimeoutMs=1000))
        async with running(config, env) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "x"}, reply_to=HOOK)
            assert (await wait_state(h.service, claimed.id)).state == "delivery_unknown"
            await h.service.resolve_continuation_delivery(claimed.id, {"kind": "not_delivered"})
            await h.after_full_scan()
            assert fake.count == 1
            rec = h.service.repo.get(claimed.id)
            assert rec is not None and rec.state == "delivery_retry"
            await h.service.retry_continuation(claimed.id, allow_unknown=True)  # the explicit retry
            assert (await wait_state(h.service, claimed.id)).state == "delivery_unknown"
            assert fake.count == 2
            await h.service.resolve_continuation_delivery(
                claimed.id, {"kind": "delivered", "deliveryId": "EXT-42"}
            )
            await h.after_full_scan()
            assert fake.count == 2


@pytest.mark.anyio
async def test_shutdown_during_a_hung_post_leaves_delivery_unknown(
    tmp_path: Path,
) -> None:
    with FakeWebhook() as fake:
        fake.script(HANG)
        config, env = make_config(tmp_path, hook_block(fake))
        async with running(config, env) as h:
            h.service.worker.drain_seconds = 0.2  # the drain bound, shortened for the test
            claimed = await reply_run(h.service, h.producer, {"summary": "x"}, reply_to=HOOK)
            await fake.wait_requests(1)
        async with running(config, env) as h2:
            await h2.after_full_scan()
            rec = h2.service.repo.get(claimed.id)
        assert fake.count == 1
    assert rec is not None and rec.state == "delivery_unknown"
    assert rec.last_error is not None and rec.last_error.code == "delivery_interrupted"


@pytest.mark.anyio
async def test_a_failed_history_append_stays_delivered_and_is_never_reposted(tmp_path: Path) -> None:
    history = ExplodingHistory()
    config, env = make_config(tmp_path)
    async with running(config, env, history=history) as h:
        claimed = await reply_run(h.service, h.producer, {"summary": "done"})
        await wait_state(h.service, claimed.id)
        status = await h.producer.status(claimed)
        health = h.service.continuation_health()
        with pytest.raises(InvalidTransition):
            await h.service.retry_continuation(claimed.id, allow_unknown=True)
        await h.after_full_scan()  # a full scan finds nothing to redo
    assert status["state"] == "delivered"
    receipt = status["receipt"]
    assert receipt["kind"] == "posted" and receipt["historyRecorded"] is False
    code = receipt["historyErrorCode"]
    assert code and len(code) <= 64 and code.startswith("AHistoryBackendFailure")
    assert history.appends == 1
    assert (health.status, health.history_unrecorded) == ("degraded", 1)
    assert len(h.outbox()) == 1


@pytest.mark.anyio
async def test_a_hung_history_append_is_bounded_and_the_post_stays_delivered(tmp_path: Path) -> None:
    history = HangingHistory()
    config, env = make_config(tmp_path, {"limits": {"deliveryTimeoutMs": 1000}})
    async with running(config, env, history=history) as h:
        claimed = await reply_run(h.service, h.producer, {"summary": "done"})
        rec = await wait_state(h.service, claimed.id)
    assert rec.state == "delivered"
    assert rec.receipt is not None
    assert (rec.receipt.history_recorded, rec.receipt.history_error_code) == (False, "history_timeout")
    assert history.appends == 1 and len(h.outbox()) == 1


@pytest.mark.anyio
async def test_shutdown_during_the_history_append_keeps_the_confirmed_post_delivered(
    tmp_path: Path,
) -> None:
    history = HangingHistory()
    config, env = make_config(tmp_path)
    async with running(config, env, history=history) as h:
        h.service.worker.drain_seconds = 0.2  # the drain bound, shortened for the test
        claimed = await reply_run(h.service, h.producer, {"summary": "done"})
        with anyio.fail_after(10):
            while history.appends == 0:
                await anyio.sleep(0.01)
    async with running(config, env, history=ExplodingHistory()) as h2:
        await h2.after_full_scan()
        # Settled records are compacted into tombstones when the service opens.
        rec = h2.service.repo.get(claimed.id) or h2.service.repo.tombstone(claimed.id)
    assert rec is not None and rec.state == "delivered"  # not delivery_unknown: the post was confirmed
    assert rec.receipt is not None
    assert (rec.receipt.history_recorded, rec.receipt.history_error_code) == (False, "history_interrupted")
    assert len(h.outbox()) == 1


class BrokenChannel:
    """An embedded host's adapter with a bug: it lacks the ``max_chunk_chars`` attribute."""

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        raise AssertionError("never reached")


@pytest.mark.anyio
async def test_an_unexpected_worker_error_parks_one_record_and_the_service_keeps_working(
    tmp_path: Path,
) -> None:
    config, env = make_config(tmp_path)
    channels = {"broken": BrokenChannel(), "*": OutboxChannel(str(tmp_path / "outbox.jsonl"))}
    async with running(config, env, channels=channels) as h:
        bad = await reply_run(h.service, h.producer, {"summary": "x"}, run_id="bad", reply_to="broken:1")
        parked = await wait_state(h.service, bad.id)
        good = await reply_run(h.service, h.producer, {"summary": "y"}, run_id="good")
        delivered = await wait_state(h.service, good.id)
    assert parked.state == "dead_lettered"
    assert parked.last_error is not None and parked.last_error.code == "internal_error"
    assert delivered.state == "delivered"
    assert [line["deliveryKey"] for line in h.outbox()] == [f"{good.id}:0"]


def _revoke(config: Any) -> Any:
    slack = msgspec.structs.replace(config.channels["slack"], allow=("slack:C2",))
    return msgspec.structs.replace(config, channels={**config.channels, "slack": slack})


@pytest.mark.anyio
async def test_allowlist_revoked_between_synthesis_and_delivery_dead_letters_without_fallback(
    tmp_path: Path,
) -> None:
    synth = RecordingSynth("the answer", hang=True)
    with FakeSlack(SLACK_TOKEN) as fake:
        config, env = make_config(tmp_path, slack_block(fake, allow=["slack:C1"]), ENV)
        async with running(config, env, synthesizer=synth) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "x"})
            await wait_state(h.service, claimed.id, ["synthesizing"])  # passed the synthesis check
            h.service.config = _revoke(config)
            synth.release.set()
            rec = await wait_state(h.service, claimed.id)
        assert fake.count == 0
    assert rec.state == "dead_lettered"
    assert rec.last_error is not None and rec.last_error.code == "destination_revoked"
    assert rec.text == "the answer"  # the text was durable before the delivery check
    assert h.outbox() == []


@pytest.mark.anyio
async def test_a_destination_not_allowed_at_synthesis_gets_no_model_call(tmp_path: Path) -> None:
    synth = RecordingSynth()
    with FakeSlack(SLACK_TOKEN) as fake:
        config, env = make_config(tmp_path, slack_block(fake, allow=["slack:C2"]), ENV)
        async with running(config, env, synthesizer=synth) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "x"})
            rec = await wait_state(h.service, claimed.id)
        assert fake.count == 0
    assert rec.state == "dead_lettered"
    assert rec.last_error is not None and rec.last_error.code == "destination_revoked"
    assert synth.calls == [] and h.outbox() == []


@pytest.mark.anyio
async def test_a_claim_past_its_deadline_without_a_result_expires(tmp_path: Path) -> None:
    clock = Clock()
    synth = RecordingSynth()
    config, env = make_config(tmp_path)
    async with running(config, env, clock=clock, synthesizer=synth) as h:
        binding = h.service.begin_run("run-1", "slack:C1:T1#2030-01-01", ROUTE)
        claimed = await h.producer.claim(binding, "task-1")  # deadline: one day ahead
        await binding.close()
        await binding.finalize([{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}])
        await binding.activate()
        clock.advance(2 * 24 * 3600 * 1000)
        rec = await wait_state(h.service, claimed.id)
        late = await h.producer.submit(claimed, {"summary": "too late"})
        health = h.service.continuation_health()
    assert rec.state == "expired"
    assert rec.last_error is not None and rec.last_error.code == "expired"
    assert late.status_code == 410 and late.json()["error"]["code"] == "closed"
    assert health.status == "degraded"
    assert synth.calls == [] and h.outbox() == []

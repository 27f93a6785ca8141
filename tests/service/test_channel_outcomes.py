"""Which adapter failures may be retried (issue 13 item 10).

Slack has no idempotency key: a 5xx after the request was sent, or an error Slack documents as
possibly partly done, may have posted, so it is ``delivery_unknown`` and never posted again;
only a failure that proves nothing was posted (no connection, a rate limit, a truncated
request) is retried. The webhook sends the chunk's delivery key as ``Idempotency-Key`` and
retries a 5xx with the same key, which is safe for a receiver that honours it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import Clock, FakeSlack, FakeWebhook, Reply
from fakes.harness import make_config, running
from fakes.producer import reply_run, wait_state
from test_worker_delivery import ENV, HOOK, SLACK_TOKEN, hook_block, slack_block

from afterword.continuations.errors import Conflict
from afterword.worker import ChunkDelivery, SlackChannel
from afterword.worker.errors import RetryableDeliveryError, UnconfirmedDeliveryError

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "answer",
    [
        FakeSlack.server_error(500),
        FakeSlack.server_error(503),
        Reply(502, b"<html>bad gateway</html>", {"Content-Type": "text/html"}),
        Reply(200, {"ok": False, "error": "internal_error"}),
        Reply(200, {"ok": False, "error": "fatal_error"}),
    ],
    ids=["500", "503", "502-html", "internal_error", "fatal_error"],
)
async def test_a_slack_failure_that_may_have_posted_is_unknown_and_never_reposted(
    tmp_path: Path, answer: Reply
) -> None:
    clock = Clock()
    with FakeSlack(SLACK_TOKEN) as fake:
        fake.script(answer)
        config, env = make_config(tmp_path, slack_block(fake), ENV)
        async with running(config, env, clock=clock) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "done"})
            rec = await wait_state(h.service, claimed.id)
            clock.advance(3_600_000)  # any backoff would have expired by now
            with pytest.raises(Conflict, match="--allow-unknown"):
                await h.service.retry_continuation(claimed.id)
            assert h.service.repo.get(claimed.id).state == "delivery_unknown"  # type: ignore[union-attr]
        assert fake.count == 1
    assert rec.state == "delivery_unknown" and rec.post_unproven


async def test_a_slack_rate_limit_proves_nothing_was_posted_and_is_retried(tmp_path: Path) -> None:
    clock = Clock()
    with FakeSlack(SLACK_TOKEN) as fake:
        fake.script(FakeSlack.rate_limited(1))
        config, env = make_config(tmp_path, slack_block(fake), ENV)
        async with running(config, env, clock=clock) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "done"})
            waiting = await wait_state(h.service, claimed.id, ["delivery_retry"])
            assert waiting.last_error is not None and waiting.last_error.code == "rate_limited"
            clock.advance(600_000)
            rec = await wait_state(h.service, claimed.id)
        assert fake.count == 2
    assert rec.state == "delivered" and not rec.post_unproven


async def test_slack_adapter_classifies_by_proof_of_no_post() -> None:
    delivery = ChunkDelivery(
        delivery_key="c_x:0", conversation_id="slack:C1:T1", chunk_index=0, chunk_count=1, text="hi"
    )
    with FakeSlack(SLACK_TOKEN) as fake:
        channel = SlackChannel(fake.url, SLACK_TOKEN)
        assert channel.can_reconcile is False
        fake.script(
            Reply(503, {"ok": False, "error": "request_timeout"}),
            Reply(504, {"ok": False, "error": "service_unavailable"}),
        )
        with pytest.raises(RetryableDeliveryError):
            await channel.post(delivery)  # a truncated request: nothing was created
        with pytest.raises(UnconfirmedDeliveryError) as info:
            await channel.post(delivery)
        assert info.value.code == "http_504"
    closed = SlackChannel("http://127.0.0.1:9", SLACK_TOKEN)  # nothing listens: never sent
    with pytest.raises(RetryableDeliveryError):
        await closed.post(delivery)


async def test_a_webhook_5xx_is_retried_with_the_same_idempotency_key(tmp_path: Path) -> None:
    clock = Clock()
    with FakeWebhook() as fake:
        fake.script(FakeWebhook.server_error(503))
        config, env = make_config(tmp_path, hook_block(fake))
        async with running(config, env, clock=clock) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "done"}, reply_to=HOOK)
            await wait_state(h.service, claimed.id, ["delivery_retry"])
            clock.advance(600_000)
            rec = await wait_state(h.service, claimed.id)
        keys = [r.headers.get("idempotency-key") for r in fake.requests]
    assert rec.state == "delivered"
    assert keys == [f"{claimed.id}:0", f"{claimed.id}:0"]

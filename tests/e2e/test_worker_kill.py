"""SIGKILL of a real ``afterword serve`` during synthesis and during delivery, then restart:
the interrupted work ends in a non-replayed terminal state and nothing is posted twice."""

from __future__ import annotations

from pathlib import Path

from _killhelpers import DetachedProducer, ServeProcess, after_full_scan
from _service import ENV, load, outbox_lines, write_config
from fakes import HANG, FakeOpenAI, FakeWebhook


def test_sigkill_during_synthesis_is_dead_lettered_after_restart_and_never_resynthesized(
    tmp_path: Path,
) -> None:
    with FakeOpenAI("late answer") as model:
        model.always(HANG)
        path = write_config(
            tmp_path,
            continuations={"synthesis": {"provider": "openai", "baseUrl": model.url + "/v1", "model": "m"}},
        )
        config = load(path)
        producer = DetachedProducer(config.base_url)
        server = ServeProcess(path, ENV, tmp_path / "serve.log")
        try:
            with server:
                claim = producer.claim("daily-attention", "daily-1")
                producer.submit(claim, {"summary": "disk full"})
                model.wait_requests_sync(1)  # the model call is in flight
                assert producer.status(claim)["state"] == "synthesizing"
                server.kill()
            model.always(None)  # the provider would now answer at once
            with server:
                status = producer.wait_state(claim)
                model_calls_after = model.count
        finally:
            producer.close()
    assert status["state"] == "dead_lettered"
    assert status["lastError"]["code"] == "synthesis_interrupted"
    assert status["attempts"]["synthesis"] == 1
    assert model_calls_after == 1
    assert outbox_lines(config) == []


def test_sigkill_during_delivery_is_delivery_unknown_after_restart_and_never_reposted(tmp_path: Path) -> None:
    with FakeWebhook() as hook:
        hook.always(HANG)
        path = write_config(
            tmp_path,
            continuations={
                "namedRoutes": {"alerts": {"mode": "notify_if_actionable", "conversationId": "hook:alerts"}},
                "channels": {
                    "hook": {"adapter": "webhook", "url": hook.url + "/in"},
                    "*": {"adapter": "outbox"},
                },
            },
        )
        config = load(path)
        producer = DetachedProducer(config.base_url)
        server = ServeProcess(path, ENV, tmp_path / "serve.log")
        try:
            with server:
                claim = producer.claim("alerts", "alert-1")
                producer.submit(claim, {"summary": "disk full"})
                hook.wait_requests_sync(1)  # the receiver has the post; its answer never comes
                server.kill()
            hook.always(None)  # the receiver would now acknowledge at once
            with server:
                status = producer.wait_state(claim)
                after_full_scan(config)  # in which the restarted worker could (wrongly) post again
                final = producer.status(claim)
        finally:
            producer.close()
        posts = hook.bodies
    assert status["state"] == final["state"] == "delivery_unknown"
    assert status["lastError"]["code"] == "delivery_interrupted"
    assert status["attempts"]["delivery"] == 1
    assert [p["deliveryKey"] for p in posts] == [f"{claim['continuationId']}:0"]
    assert outbox_lines(config) == []

"""Operator verbs against a delivery in flight (issue 28, point 1).

While a post is in flight, or chunks of the answer have receipts, no operator verb may hide
the post or clear the mark that turns a crash into ``delivery_unknown``: each one is refused
with a 409 naming why (``transitions.OPERATOR_REFUSALS``), and the post's receipt is recorded
when it arrives. The service tests use a real webhook receiver that holds its answer until the
test releases it, as in the report.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from _claims import make_claim
from fakes import FakeWebhook, Reply, Request
from fakes.harness import after_full_scan, make_config, running
from fakes.producer import Producer, reply_run, wait_state
from fakes.scripted import KillSwitch

import afterword
from afterword.continuations import Continuation, ResultRecord
from afterword.continuations import lifecycle as lc
from afterword.continuations.actions import next_action
from afterword.continuations.errors import Conflict, InvalidTransition
from afterword.continuations.model import STATES, Receipt
from afterword.continuations.retention import tombstone_of
from afterword.continuations.transitions import FLAGS, OPERATOR_REFUSALS, TRANSITIONS, flags
from afterword.store import MAX_RECORD_BYTES, StoreOptions
from afterword.wal import WalOptions

NOW = 1_900_000_000_000
RESULT = ResultRecord(idempotency_key="r1", payload_hash="a" * 64, payload=b"{}", received_at_ms=NOW)


def ready(**changes: Any) -> Continuation:
    rec = Continuation(
        claim=make_claim(created_at_ms=NOW - 1000, deadline_ms=NOW + 3_600_000),
        claim_mac="m",
        state="ready_to_deliver",
        origin_context="pinned",
        result=RESULT,
        text="answer",
        completion_kind="synthesized",
    )
    return msgspec.structs.replace(rec, **changes)


# -- the pure table ----------------------------------------------------------------------------
# Written from the rule, not from the table: the verbs each operator action can take, and the
# states where the state row alone would let it act.
VERB_CALLS: dict[str, Callable[[Continuation], object]] = {
    "cancel": lambda r: lc.cancel(r, NOW),
    "retry": lambda r: lc.retry(r, allow_unknown=False, now_ms=NOW),
    "retry_allow_unknown": lambda r: lc.retry(r, allow_unknown=True, now_ms=NOW),
    "resolve_delivered": lambda r: lc.resolve(r, "delivered", "d9", NOW),
    "resolve_not_delivered": lambda r: lc.resolve(r, "not_delivered", None, NOW),
    "resolve_dead_lettered": lambda r: lc.resolve(r, "dead_lettered", None, NOW),
    "acknowledge": lambda r: lc.acknowledge(r, NOW),
}


def test_the_refusal_table_names_every_verb_and_only_known_flags() -> None:
    assert set(OPERATOR_REFUSALS) == set(VERB_CALLS)
    for verb, refusals in OPERATOR_REFUSALS.items():
        assert set(refusals) <= set(FLAGS), verb
        assert "in_flight" in refusals, f"{verb} may act on a post in flight"


@pytest.mark.parametrize("verb", sorted(VERB_CALLS))
@pytest.mark.parametrize("state", ["ready_to_deliver", "delivery_retry"])
def test_every_verb_is_refused_while_a_post_is_in_flight(verb: str, state: str) -> None:
    rec = lc.begin_delivery(ready(state=state, next_attempt_at_ms=NOW), NOW)
    assert "in_flight" in flags(rec) and "held" not in flags(rec)
    with pytest.raises(Conflict) as info:
        VERB_CALLS[verb](rec)
    # Refused by the flag (named in the message) or by the state row; never accepted.
    assert "in flight" in str(info.value) or isinstance(info.value, InvalidTransition)
    event = {"retry": "retry_delivery", "retry_allow_unknown": "retry_delivery"}.get(verb, verb)
    if event in TRANSITIONS[state]:
        assert "in flight" in str(info.value)  # the state row alone would have allowed it


def test_a_record_marked_in_flight_in_any_state_refuses_every_verb() -> None:
    """Even in a state the worker never leaves in flight, the flag alone refuses."""
    for state in STATES:
        rec = ready(state=state, delivery_in_flight=True, result=RESULT)
        for verb, call in VERB_CALLS.items():
            try:
                out = call(rec)
            except Conflict:
                continue
            if out is None:
                continue  # an idempotent repeat (cancel of a cancelled record) changes nothing
            raise AssertionError(f"{verb} in {state} with a post in flight answered {out!r}")


def test_chunk_receipts_are_never_dropped_or_reposted_by_a_verb() -> None:
    partial = lc.delivery_unknown(
        lc.record_chunk(lc.begin_delivery(ready(), NOW), "d0", NOW), "partial_delivery", "1 chunk", NOW
    )
    assert partial.chunk_receipts == ("d0",) and "chunk_receipts" in flags(partial)
    for verb in ("retry", "retry_allow_unknown", "resolve_not_delivered"):
        with pytest.raises(Conflict, match="chunk"):
            VERB_CALLS[verb](partial)
    done = lc.resolve(partial, "delivered", "d1", NOW)
    assert done.receipt is not None and done.receipt.delivery_ids == ("d0", "d1")
    dead = lc.resolve(partial, "dead_lettered", None, NOW)
    assert dead.chunk_receipts == ("d0",)
    with pytest.raises(Conflict, match="chunk"):  # posting it again would repeat chunk 0
        lc.retry(dead, allow_unknown=True, now_ms=NOW)
    acked = lc.acknowledge(dead, NOW)
    assert acked is not None and tombstone_of(acked).chunk_receipts == ("d0",)  # kept after compaction


def test_next_action_reads_the_same_flags() -> None:
    in_flight = lc.begin_delivery(ready(), NOW)
    assert next_action(in_flight, NOW).kind == "none"
    held = msgspec.structs.replace(ready(state="delivery_retry"), next_attempt_at_ms=None)
    assert flags(held) == {"held"} and next_action(held, NOW).kind == "none"
    deferred = ready(state="result_received", origin_context="pending", text=None)
    assert "deferred" in flags(deferred) and next_action(deferred, NOW).kind == "none"
    unproven = ready(post_unproven=True)
    assert "unproven" in flags(unproven) and next_action(unproven, NOW).kind == "hold"
    assert "cancel" in TRANSITIONS["ready_to_deliver"]  # the state row alone allows a cancel


def test_a_late_receipt_is_kept_beside_the_state_someone_else_wrote() -> None:
    """The worker's completion never drops proof of a post, nor overwrites an ended record."""
    in_flight = lc.begin_delivery(ready(), NOW)
    receipt = Receipt(kind="posted", delivered_at_ms=NOW, delivery_ids=("wh-1",))
    done = lc.settle_post(in_flight, receipt, NOW)
    assert done is not None and done.state == "delivered" and done.receipt == receipt
    ended = msgspec.structs.replace(
        in_flight, state="cancelled", delivery_in_flight=False, terminal_at_ms=NOW
    )
    late = lc.settle_post(ended, receipt, NOW + 1)
    assert late is not None and late.state == "cancelled" and late.receipt == receipt
    assert late.last_error is not None and late.last_error.code == "late_receipt"
    assert lc.settle_post(done, receipt, NOW) is None


# -- the service, with a webhook receiver that holds its answer ---------------------------------
class Held:
    """A webhook action that records the post, then holds the answer until released."""

    def __init__(self, answer: Reply) -> None:
        self.answer = answer
        self.arrived = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: Request) -> Reply:
        self.arrived.set()
        self.release.wait(30)
        return self.answer

    async def wait(self) -> None:
        assert await anyio.to_thread.run_sync(self.arrived.wait, 15), "the post never arrived"


@contextmanager
def webhook(tmp_path: Path, *actions: Any) -> Iterator[tuple[FakeWebhook, Any, dict[str, str]]]:
    with FakeWebhook() as fake:
        fake.script(*actions)
        block = {
            "limits": {"deliveryTimeoutMs": 20_000},
            "channels": {
                "hook": {"adapter": "webhook", "url": fake.url + "/deliver"},
                "*": {"adapter": "outbox"},
            },
        }
        config, env = make_config(tmp_path, block)
        yield fake, config, env


async def operator_post(
    service: Any, cid: str, verb: str, body: dict[str, Any] | None = None
) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await client.post(
            service.base_url + f"/v1/operator/continuations/{cid}/{verb}",
            headers={"Authorization": "Bearer " + service.operator_token()},
            json=body or {},
        )


@pytest.mark.anyio
async def test_cancel_during_an_in_flight_post_is_refused_and_the_receipt_recorded(tmp_path: Path) -> None:
    held = Held(Reply(200, {"id": "wh-held"}))
    with webhook(tmp_path, held) as (fake, config, env):
        async with running(config, env) as h:
            svc = h.service
            claimed = await reply_run(svc, h.producer, {"summary": "x"}, reply_to="hook:a")
            await held.wait()
            assert svc.continuation_detail(claimed.id).status.in_flight
            answers = {}
            for verb, body in (
                ("cancel", None),
                ("retry", None),
                ("retry", {"allowUnknown": True}),
                ("resolve", {"kind": "not_delivered"}),
                ("acknowledge", None),
            ):
                answers[verb, bool(body)] = await operator_post(svc, claimed.id, verb, body)
            held.release.set()
            rec = await wait_state(svc, claimed.id)
            health = svc.continuation_health()
    for (verb, _), r in answers.items():
        assert r.status_code == 409, (verb, r.text)
        assert r.json()["error"]["code"] == "conflict"
    assert "in flight" in answers["cancel", False].json()["error"]["message"]
    assert rec.state == "delivered" and rec.receipt is not None and rec.receipt.delivery_ids == ("wh-held",)
    assert health.status == "healthy" and "cancelled" not in health.counts
    assert fake.count == 1


@pytest.mark.anyio
async def test_retry_during_an_in_flight_post_keeps_the_crash_an_unknown_outcome(tmp_path: Path) -> None:
    """The report: a 503, then attempt 2 in flight; a retry then cleared the in-flight mark,
    and after a crash the answer was posted a third time."""
    held = Held(Reply(200, {"id": "wh-2"}))
    with webhook(tmp_path, FakeWebhook.server_error(503), held) as (fake, config, env):
        switch = KillSwitch(WalOptions().max_payload, MAX_RECORD_BYTES)
        async with (
            afterword.open_service(
                config, environ=env, store_options=StoreOptions(observe_transaction=switch.observe)
            ) as svc,
            httpx.AsyncClient(timeout=10) as client,
        ):
            svc.worker.delivery.jitter = lambda: 0.0  # type: ignore[attr-defined]
            claimed = await reply_run(svc, Producer(client), {"summary": "x"}, reply_to="hook:a")
            await held.wait()
            rec = svc.repo.get(claimed.id)
            assert rec is not None and rec.state == "delivery_retry" and rec.delivery_in_flight
            retried = await operator_post(svc, claimed.id, "retry")
            switch.trip()  # SIGKILL: nothing after this moment becomes durable
            held.release.set()  # the receiver got the post and answers 200
            await fake.wait_requests(2)
            await after_full_scan(svc.worker)  # the answered post's (lost) commit has been tried
        async with running(config, env) as h:
            rec = await wait_state(h.service, claimed.id, ("delivery_unknown", "delivered"))
            await h.after_full_scan()  # a scan in which the worker could post
    assert fake.count == 2  # the 503 and the held post; never a third
    assert rec.state == "delivery_unknown" and rec.post_unproven
    assert retried.status_code == 409 and "in flight" in retried.json()["error"]["message"]


@pytest.mark.anyio
async def test_a_receipt_arriving_after_the_record_ended_is_kept(tmp_path: Path) -> None:
    """The worker side: should anything end the record while its post is in flight (the verbs
    refuse to), the confirmed post's receipt is recorded, not dropped, and that state kept."""
    held = Held(Reply(200, {"id": "wh-late"}))
    with webhook(tmp_path, held) as (_fake, config, env):
        async with running(config, env) as h:
            svc = h.service
            claimed = await reply_run(svc, h.producer, {"summary": "x"}, reply_to="hook:a")
            await held.wait()
            rec = svc.repo.get(claimed.id)
            assert rec is not None and rec.delivery_in_flight
            ended = msgspec.structs.replace(
                rec, state="dead_lettered", delivery_in_flight=False, terminal_at_ms=rec.updated_at_ms
            )
            await svc.commit([(rec, ended)])
            held.release.set()
            for _ in range(500):
                rec = svc.repo.get(claimed.id)
                if rec is not None and rec.receipt is not None:
                    break
                await anyio.sleep(0.01)
    assert rec is not None and rec.state == "dead_lettered"
    assert rec.receipt is not None and rec.receipt.delivery_ids == ("wh-late",)
    assert rec.last_error is not None and rec.last_error.code == "late_receipt"


def test_health_offers_a_partial_answer_only_the_verdicts_it_accepts() -> None:
    """Found by the stateful race test: health offered `not-delivered` for a partly delivered
    answer, which the verb then refused (its chunk receipts contradict it)."""
    from afterword.continuations.health import assess

    partial = lc.delivery_unknown(
        lc.record_chunk(lc.begin_delivery(ready(), NOW), "d0", NOW), "partial_delivery", "1 chunk", NOW
    )
    whole = lc.delivery_unknown(lc.begin_delivery(ready(), NOW), "delivery_timeout", "no answer", NOW)
    whole = msgspec.structs.replace(whole, claim=msgspec.structs.replace(whole.claim, id="c_whole"))
    (cause,) = assess([partial, whole], []).causes
    by_id = dict(zip(cause.ids, cause.commands, strict=True))
    assert by_id[partial.id].endswith(" <delivered DELIVERY_ID|dead-lettered>")
    assert by_id["c_whole"].endswith(" <delivered DELIVERY_ID|not-delivered|dead-lettered>")
    assert lc.resolve(partial, "dead_lettered", None, NOW).state == "dead_lettered"

"""An answer whose post was ever unproven is never posted again without the unsafe opt-in.

Issue 13 item 2: ``delivery_unknown -> resolve dead-lettered -> retry`` used to post again.
The fact "a post began and was never proven" is now sticky on the record, and every path that
could post (operator retry after any verdict, recovery, a scheduled attempt, migration) needs
``allow_unknown``. Two layers check it: the pure lifecycle under every sequence of operator
verbs, worker steps and restarts up to a bound, and the real service for every operator-verb
sequence of length two plus the reported one, across a restart.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from _claims import make_claim
from fakes.harness import after_full_scan, make_config, running
from fakes.producer import wait_state

from afterword.continuations import Continuation, ContinuationError, ErrorInfo, ResultRecord
from afterword.continuations import lifecycle as lc
from afterword.continuations.model import Receipt
from afterword.worker import ChunkDelivery, ChunkReceipt
from afterword.worker.errors import RetryableDeliveryError, UnconfirmedDeliveryError

NOW = 1_900_000_000_000
RESULT = ResultRecord(idempotency_key="r1", payload_hash="a" * 64, payload=b"{}", received_at_ms=NOW)


def unknown_record() -> Continuation:
    claim = make_claim(created_at_ms=NOW - 1000, deadline_ms=NOW + 3_600_000)
    rec = Continuation(
        claim=claim,
        claim_mac="m",
        state="ready_to_deliver",
        origin_context="pinned",
        result=RESULT,
        text="answer",
        completion_kind="synthesized",
    )
    rec = lc.begin_delivery(rec, NOW)
    return lc.delivery_unknown(rec, "delivery_timeout", "no answer", NOW)


# -- the pure layer: every sequence of verbs, worker steps and restarts ------------------------
def _due(rec: Continuation) -> bool:
    """Whether the worker would pick the record up for delivery (time is always past due)."""
    if rec.delivery_in_flight:
        return False
    return rec.state == "ready_to_deliver" or (
        rec.state == "delivery_retry" and rec.next_attempt_at_ms is not None
    )


Step = Callable[[Continuation], Continuation | None]
OPERATOR: dict[str, Step] = {
    "resolve-delivered": lambda r: lc.resolve(r, "delivered", "EXT-1", NOW),
    "resolve-not-delivered": lambda r: lc.resolve(r, "not_delivered", None, NOW),
    "resolve-dead-lettered": lambda r: lc.resolve(r, "dead_lettered", None, NOW),
    "retry": lambda r: lc.retry(r, allow_unknown=False, now_ms=NOW),
    "cancel": lambda r: lc.cancel(r, NOW),
}
UNSAFE = "retry --allow-unknown"
WORKER = ("post-ok", "post-unknown", "post-refused-retryable", "restart")
VERBS = (*OPERATOR, UNSAFE, *WORKER)


def _run(sequence: tuple[str, ...]) -> None:
    """Apply ``sequence``; assert every post was licensed by its own unsafe opt-in.

    ``licensed`` is an independent model of the rule: an unsafe retry grants one post; a post
    whose outcome is proven not to have happened keeps the licence, any other post spends it.
    """
    rec = unknown_record()
    licensed = False
    for verb in sequence:
        try:
            if verb in OPERATOR:
                rec = OPERATOR[verb](rec) or rec
            elif verb == UNSAFE:
                rec = lc.retry(rec, allow_unknown=True, now_ms=NOW)
                licensed = True
            elif verb == "restart":
                rec = lc.recover(rec, NOW) or rec
            elif _due(rec):
                if not lc.may_post(rec):
                    rec = lc.hold_unproven(rec, NOW)
                    continue
                rec = lc.begin_delivery(rec, NOW)  # the channel is called after this commit
                assert licensed, f"posted again without the opt-in: {sequence}"
                if verb == "post-ok":
                    receipt = Receipt(kind="posted", delivered_at_ms=NOW, delivery_ids=("d",))
                    rec, licensed = lc.delivered(rec, receipt, NOW), False
                elif verb == "post-unknown":
                    rec, licensed = lc.delivery_unknown(rec, "delivery_timeout", "x", NOW), False
                else:
                    rec = lc.delivery_failed(
                        rec,
                        retryable=True,
                        code="rate_limited",
                        message="x",
                        next_attempt_at_ms=NOW,
                        now_ms=NOW,
                    )
        except ContinuationError:
            pass  # a refused verb changes nothing
        assert rec.post_unproven, f"the unproven fact was lost after {sequence}"


def test_no_sequence_of_verbs_steps_and_restarts_reposts_without_the_opt_in() -> None:
    count = 0
    for length in range(1, 5):
        for sequence in itertools.product(VERBS, repeat=length):
            _run(sequence)
            count += 1
    assert count == sum(len(VERBS) ** n for n in range(1, 5))


@pytest.mark.parametrize("verdict", ["not_delivered", "dead_lettered"])
def test_a_plain_retry_after_any_verdict_names_the_real_flag(verdict: str) -> None:
    rec = lc.resolve(unknown_record(), verdict, None, NOW)  # type: ignore[arg-type]
    assert rec.post_unproven
    with pytest.raises(ContinuationError, match="--allow-unknown"):
        lc.retry(rec, allow_unknown=False, now_ms=NOW)
    retried = lc.retry(rec, allow_unknown=True, now_ms=NOW)
    assert retried.repost_allowed and retried.post_unproven
    assert lc.may_post(retried)


def test_a_due_unproven_record_is_held_with_a_visible_cause() -> None:
    # A migration or scheduler that makes an unproven record due must not make it post.
    rec = lc.resolve(unknown_record(), "not_delivered", None, NOW)
    import msgspec

    due = msgspec.structs.replace(rec, next_attempt_at_ms=NOW)
    with pytest.raises(ContinuationError, match="--allow-unknown"):
        lc.begin_delivery(due, NOW)
    held = lc.hold_unproven(due, NOW)
    assert held.state == "delivery_retry" and held.next_attempt_at_ms is None
    assert held.last_error == ErrorInfo.bounded("repost_needs_opt_in", lc.UNPROVEN_REFUSAL)


def test_the_opt_in_ends_when_the_record_is_terminal_again() -> None:
    rec = lc.retry(unknown_record(), allow_unknown=True, now_ms=NOW)
    rec = lc.begin_delivery(rec, NOW)
    rec = lc.delivery_failed(
        rec, retryable=False, code="channel_not_found", message="x", next_attempt_at_ms=None, now_ms=NOW
    )
    assert rec.state == "dead_lettered" and not rec.repost_allowed
    with pytest.raises(ContinuationError, match="--allow-unknown"):
        lc.retry(rec, allow_unknown=False, now_ms=NOW)


# -- the real service ------------------------------------------------------------------------
class FirstPostLost:
    """Every key's first post may have happened but is never confirmed; later ones succeed."""

    max_chunk_chars = 4000

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        self.calls[delivery.delivery_key] += 1
        if self.calls[delivery.delivery_key] == 1:
            raise UnconfirmedDeliveryError("the channel dropped the connection after the request")
        return ChunkReceipt(delivery_id=delivery.delivery_key, channel_id="test")


SERVICE_VERBS = ("resolve-delivered", "resolve-not-delivered", "resolve-dead-lettered", "retry", "cancel")


@pytest.mark.anyio
async def test_every_operator_sequence_on_the_service_posts_nothing_without_the_opt_in(
    tmp_path: Path,
) -> None:
    sequences = [s for n in (1, 2) for s in itertools.product(SERVICE_VERBS, repeat=n)]
    sequences.append(("resolve-dead-lettered", "retry", "cancel"))  # the reported sequence, longer
    channel = FirstPostLost()
    config, env = make_config(tmp_path)
    ids: dict[tuple[str, ...], str] = {}
    async with running(config, env, channels={"*": channel}) as h:
        for i, sequence in enumerate(sequences):
            claimed = await h.producer.detached(config.base_url, "daily-attention", f"task-{i}")
            response = await h.producer.submit(claimed, {"summary": f"result {i}"})
            assert response.status_code == 200
            ids[sequence] = claimed.id
        for cid in ids.values():
            rec = await wait_state(h.service, cid)
            assert rec.state == "delivery_unknown" and rec.post_unproven
        svc = h.service
        verbs = {
            "resolve-delivered": lambda c: svc.resolve_continuation_delivery(
                c, {"kind": "delivered", "deliveryId": "EXT-1"}
            ),
            "resolve-not-delivered": lambda c: svc.resolve_continuation_delivery(
                c, {"kind": "not_delivered"}
            ),
            "resolve-dead-lettered": lambda c: svc.resolve_continuation_delivery(
                c, {"kind": "dead_lettered"}
            ),
            "retry": lambda c: svc.retry_continuation(c),
            "cancel": lambda c: svc.cancel_continuation(c),
        }
        for sequence, cid in ids.items():
            for verb in sequence:
                try:
                    await verbs[verb](cid)
                except ContinuationError:
                    pass
        await h.after_full_scan()  # a full scan in which the worker could post
    async with running(config, env, channels={"*": channel}) as h:  # recovery, then the worker
        await h.after_full_scan()
        reposted = {s: channel.calls[f"{cid}:0"] for s, cid in ids.items() if channel.calls[f"{cid}:0"] != 1}
        for cid in ids.values():
            body = h.service.status(cid, _token(h, cid))
            assert body.post_unproven, body
        # The explicit opt-in is the one way to post it again, and it posts exactly once.
        target = ids[("resolve-not-delivered",)]  # held, still live (settled ones may be compacted)
        await h.service.retry_continuation(target, allow_unknown=True)
        rec = await wait_state(h.service, target, ("delivered",))
        assert rec.receipt is not None and rec.receipt.kind == "posted"
        assert rec.post_unproven  # still shows its history
    assert reposted == {}
    assert channel.calls[f"{target}:0"] == 2


def _token(h: object, cid: str) -> str:
    from afterword.continuations.capabilities import result_token

    return result_token(h.service._keys.result, cid)


@pytest.mark.anyio
async def test_an_authorised_repost_that_fails_retryably_keeps_retrying_itself(tmp_path: Path) -> None:
    class LostThenBusyThenOk(FirstPostLost):
        async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
            self.calls[delivery.delivery_key] += 1
            n = self.calls[delivery.delivery_key]
            if n == 1:
                raise UnconfirmedDeliveryError("lost")
            if n == 2:
                raise RetryableDeliveryError("rate_limited", "busy", 0.0)
            return ChunkReceipt(delivery_id=delivery.delivery_key, channel_id="test")

    channel = LostThenBusyThenOk()
    config, env = make_config(tmp_path)
    async with running(config, env, channels={"*": channel}) as h:
        h.worker.delivery.jitter = lambda: 0.0
        claimed = await h.producer.detached(config.base_url, "daily-attention", "task-x")
        await h.producer.submit(claimed, {"summary": "x"})
        await wait_state(h.service, claimed.id, ("delivery_unknown",))
        await h.service.retry_continuation(claimed.id, allow_unknown=True)
        rec = await wait_state(h.service, claimed.id, ("delivered",), timeout=20)
    assert rec.state == "delivered" and channel.calls[f"{claimed.id}:0"] == 3


@pytest.mark.anyio
async def test_a_migrated_unknown_delivery_stays_unproven_through_a_verdict(tmp_path: Path) -> None:
    """Migration is one more path that could post again: a legacy delivery_unknown arrives
    unproven, and after resolve not-delivered a plain retry is still refused."""
    from _legacy import record, write_v1
    from _service import ENV, load, outbox_lines, write_config

    import afterword

    config = load(write_config(tmp_path))
    write_v1(Path(config.state_dir), [record("lost", "delivery_unknown", text="answer of unknown fate")])
    async with afterword.open_service(config, environ=ENV, serve_http=False) as service:
        (rec,) = service.repo.live()
        assert rec.state == "delivery_unknown" and rec.post_unproven
        await service.resolve_continuation_delivery(rec.id, {"kind": "not_delivered"})
        with pytest.raises(ContinuationError, match="--allow-unknown"):
            await service.retry_continuation(rec.id)
        await after_full_scan(service.worker)  # type: ignore[attr-defined]
    assert outbox_lines(config) == []

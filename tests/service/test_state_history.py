"""The bounded state history kept in each record, and delivery attempts counted across
operator retries (continuations.trail, applied by the service at every commit)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from _claims import make_claim
from fakes.harness import make_config, running

from afterword.continuations.model import Attempts, Continuation, ErrorInfo
from afterword.continuations.retention import tombstone_of
from afterword.continuations.trail import MAX_STATE_HISTORY, record_change
from afterword.protocol.views import detail_body, status_body


def rec(state: str = "claimed", at: int = 1000, **changes: object) -> Continuation:
    base = Continuation(claim=make_claim(created_at_ms=1000, deadline_ms=10**12), claim_mac="m")
    return msgspec.structs.replace(base, state=state, updated_at_ms=at, **changes)  # type: ignore[arg-type]


def test_entries_are_appended_on_state_changes_only() -> None:
    first = record_change(None, rec(), 1000)
    assert [(h.state, h.at_ms) for h in first.history] == [("claimed", 1000)]
    same = record_change(first, msgspec.structs.replace(first, updated_at_ms=1500), 1500)
    assert same.history == first.history
    err = ErrorInfo.bounded("http_400", "refused")
    dead = record_change(first, rec("dead_lettered", 2000, last_error=err), 2000)
    assert [(h.state, h.at_ms, h.error) for h in dead.history] == [
        ("claimed", 1000, None),
        ("dead_lettered", 2000, "http_400"),
    ]


def test_history_continues_from_the_stored_version_not_a_stale_copy() -> None:
    stored = record_change(None, rec(), 1000)
    stored = record_change(stored, rec("result_received", 1100), 1100)
    stale_derived = rec("synthesizing", 1200)  # built from a copy that never saw the history
    new = record_change(stored, stale_derived, 1200)
    assert [h.state for h in new.history] == ["claimed", "result_received", "synthesizing"]


def test_history_is_bounded_and_keeps_the_first_entry() -> None:
    current = record_change(None, rec(), 0)
    for i in range(1, 100):
        state = "delivery_retry" if i % 2 else "ready_to_deliver"
        current = record_change(current, rec(state, i), i)
    assert len(current.history) == MAX_STATE_HISTORY
    assert current.history[0].state == "claimed" and current.history[-1].at_ms == 99
    assert detail_body(current).history_complete is False


def test_delivery_attempts_accumulate_across_an_operator_retry() -> None:
    stored = rec("dead_lettered", 1000, attempts=Attempts(synthesis=1, delivery=3))
    retried = record_change(
        stored, rec("delivery_retry", 1100, attempts=Attempts(synthesis=1, delivery=0)), 1100
    )
    assert retried.delivery_attempts_before == 3
    again = record_change(
        retried, msgspec.structs.replace(retried, attempts=Attempts(synthesis=1, delivery=2)), 1200
    )
    assert status_body(again).attempts.delivery == 5
    assert tombstone_of(again).attempts.delivery == 5


@pytest.mark.anyio
async def test_history_never_pushes_a_near_limit_record_over_the_store_limit(tmp_path: Path) -> None:
    from afterword.continuations.model import encode

    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        claimed = await h.producer.detached(h.service.base_url, "daily-attention", "near-limit")
        current = h.service.repo.get(claimed.id)
        assert current is not None and [x.state for x in current.history] == ["claimed"]
        limit = h.service.store.options.max_record_bytes
        big = msgspec.structs.replace(current, state="ready_to_deliver", text="")
        room = limit - len(encode(big)) - 4  # fits as is; one more history entry would not
        big = msgspec.structs.replace(big, text="y" * room)
        await h.service.commit([(current, big)])
        stored = h.service.repo.get(claimed.id)
        assert stored is not None and stored.state == "ready_to_deliver" and stored.history == ()

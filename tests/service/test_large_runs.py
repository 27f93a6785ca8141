"""A run with many large early results settles, abandons and restarts (issue 13 item 1).

45 results of ~250 KiB (about 11 MiB together, more than one WAL transaction may hold) go
through the public surfaces: claims and results over HTTP, the host binding's finalize,
activate and abandon, and a restart with the whole run still pending.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from fakes.harness import make_config, running
from fakes.producer import ORIGIN_HISTORY, Claimed, Producer, wait_state

from afterword import ContinuationService
from afterword.continuations import FALLBACK_TEXT

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]
RESULTS = 45
DETAIL = "x" * (250 * 1024)


async def run_with_large_results(
    service: ContinuationService, producer: Producer, run_id: str
) -> tuple[object, list[Claimed]]:
    binding = service.begin_run(run_id, f"slack:C1:T1#{run_id}", "slack:C1:T1")
    claims = [await producer.claim(binding, f"{run_id}-{i}") for i in range(RESULTS)]
    for i, claimed in enumerate(claims):  # early: the origin is still pending
        response = await producer.submit(claimed, {"summary": f"{run_id} part {i}", "detail": DETAIL})
        assert response.status_code == 200, response.text
        assert response.json()["deferred"] is True
    await binding.close()
    return binding, claims


@pytest.mark.slow
async def test_large_run_finalizes_activates_and_abandons(tmp_path: Path) -> None:
    config, env = make_config(tmp_path)
    async with running(config, env) as h:
        svc = h.service
        binding, claims = await run_with_large_results(svc, h.producer, "big-a")
        # Records stay small: the payloads live out of line, pinned by their records.
        digests = set()
        for c in claims:
            stored = svc.store.get("c/" + c.id)
            assert stored is not None and len(stored.value) < 4096
            rec = svc.repo.get(c.id)
            assert rec is not None and rec.result is not None and rec.result.payload_digest in stored.blobs
            digests.add(rec.result.payload_digest)
        assert len(digests) == RESULTS and all(d in svc.payloads for d in digests)
        assert await binding.finalize(list(ORIGIN_HISTORY)) is not None  # type: ignore[attr-defined]
        await binding.activate()  # type: ignore[attr-defined]
        other, abandoned = await run_with_large_results(svc, h.producer, "big-b")
        await other.abandon()  # type: ignore[attr-defined]
        for c in claims + abandoned:
            assert (await wait_state(svc, c.id, timeout=120)).state == "delivered"
        assert {svc.repo.get(c.id).origin_context for c in claims} == {"pinned"}  # type: ignore[union-attr]
        assert {svc.repo.get(c.id).origin_context for c in abandoned} == {"abandoned"}  # type: ignore[union-attr]
        await svc.apply_retention()  # compacted: the payload blobs lose their last reference
        assert not any(d in svc.payloads for d in digests)
        assert not (Path(config.state_dir) / "payloads" / next(iter(digests))).exists()
    texts = [line["text"] for line in h.outbox()]
    assert sorted(t for t in texts if "big-a" in t) == sorted(
        f"Update on your earlier request: big-a part {i}" for i in range(RESULTS)
    )
    assert texts.count(FALLBACK_TEXT) == RESULTS


async def test_restart_with_a_large_pending_run_recovers(tmp_path: Path) -> None:
    config, env = make_config(tmp_path)
    async with running(config, env) as h:
        _, claims = await run_with_large_results(h.service, h.producer, "big-c")
        # the host dies before settling: nothing was finalized or activated
    async with running(config, env) as h2:  # recover() must succeed, in bounded transactions
        for c in claims:
            rec = await wait_state(h2.service, c.id, timeout=120)
            assert (rec.state, rec.origin_context) == ("delivered", "abandoned")
    assert [line["text"] for line in h2.outbox()] == [FALLBACK_TEXT] * RESULTS
    await anyio.sleep(0)


async def test_a_record_that_cannot_grow_is_parked_and_startup_completes(tmp_path: Path) -> None:
    """Recovery must change a record (an interrupted delivery) whose next version exceeds
    the per-record limit: it is parked where health shows it, and the service starts."""
    import msgspec

    from afterword.continuations.model import decode_continuation, encode
    from afterword.store import MAX_RECORD_BYTES, Put, RecordStore

    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        claimed = await h.producer.detached(h.service.base_url, "daily-attention", "near-limit")
    with RecordStore.open(config.state_dir) as store:
        rec = decode_continuation(store.get("c/" + claimed.id).value)  # type: ignore[union-attr]
        rec = msgspec.structs.replace(
            rec, state="ready_to_deliver", text="", completion_kind="synthesized", delivery_in_flight=True
        )
        room = MAX_RECORD_BYTES - len(encode(rec)) - 8  # the recovered version adds an error
        rec = msgspec.structs.replace(rec, text="y" * room)
        store.transact_sync([Put("c/" + rec.id, encode(rec))])
    async with running(config, env, run_worker=False) as h2:
        parked = h2.service.repo.get(claimed.id)
        assert parked is not None and parked.state == "delivery_unknown"  # posting may have begun
        assert parked.last_error is not None and parked.last_error.code == "record_too_large"
        health = h2.service.continuation_health()
        assert health.status == "unhealthy" and health.causes[0].ids == [claimed.id]


async def test_payload_blob_is_verified_and_a_damaged_one_is_parked(tmp_path: Path) -> None:
    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        claimed = await h.producer.detached(h.service.base_url, "daily-attention", "damaged")
        response = await h.producer.submit(claimed, {"summary": "s", "detail": DETAIL})
        assert response.status_code == 200
        rec = h.service.repo.get(claimed.id)
        assert rec is not None and rec.result is not None and rec.result.payload_digest is not None
        digest = rec.result.payload_digest
    blob = Path(config.state_dir) / "payloads" / digest
    blob.write_bytes(blob.read_bytes().replace(b"xxxx", b"xxyx", 1))  # same size, other content
    async with running(config, env) as h2:
        rec = await wait_state(h2.service, claimed.id)
    assert rec.state == "dead_lettered" and rec.last_error is not None
    assert rec.last_error.code == "payload_unreadable"
    assert h2.outbox() == []


async def test_records_with_inline_payloads_still_load_and_deliver(tmp_path: Path) -> None:
    """Upgrade path: a record written before payloads moved out of line (a large payload
    inline, no digest) is read and delivered unchanged."""
    import msgspec

    from afterword.continuations.model import ResultRecord, decode_continuation, encode
    from afterword.store import Put, RecordStore

    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        claimed = await h.producer.detached(h.service.base_url, "daily-attention", "old-format")
    payload = msgspec.json.encode({"summary": "from an older build", "detail": DETAIL}, order="sorted")
    import hashlib

    with RecordStore.open(config.state_dir) as store:
        rec = decode_continuation(store.get("c/" + claimed.id).value)  # type: ignore[union-attr]
        result = ResultRecord(
            idempotency_key="k",
            payload_hash=hashlib.sha256(payload).hexdigest(),
            payload=payload,
            received_at_ms=1,
        )
        rec = msgspec.structs.replace(rec, state="result_received", result=result)
        store.transact_sync([Put("c/" + rec.id, encode(rec))])
    async with running(config, env) as h2:
        assert (await wait_state(h2.service, claimed.id)).state == "delivered"
    assert [line["text"] for line in h2.outbox()] == ["From a background service: from an older build"]

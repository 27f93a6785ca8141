"""Retention: tombstones keep idempotency, captured text expires, blobs are swept."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from _service import ENV, deadline, load, payload_hash, write_config

import afterword
from afterword.continuations.errors import Conflict
from afterword.protocol.wire import DetachedClaimRequest, ResultRequest

pytestmark = pytest.mark.anyio


async def wait_for(predicate, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


# One deadline for the whole module: a repeated claim must repeat it exactly, and deadline()
# reads the wall clock at second resolution, so two calls can differ across a second's tick.
DEADLINE = deadline()


async def settle(service: afterword.ContinuationService, route: str, key: str, payload: object) -> str:
    from _service import DETACHED_TOKEN

    claim = await service.detached_claim(
        "work-control",
        DETACHED_TOKEN,
        DetachedClaimRequest(route=route, task_key=key, task_hash="h-" + key, deadline=DEADLINE),
    )
    await service.submit_result(
        claim.continuation_id,
        claim.result_token,
        ResultRequest(idempotency_key="k-" + key, payload_hash=payload_hash(payload), payload=payload),
        100,
    )
    cid = claim.continuation_id
    await wait_for(lambda: (r := service.repo.get(cid)) is not None and r.state == "delivered")
    return cid


async def test_retention_bounds(tmp_path: Path) -> None:
    config = load(
        write_config(
            tmp_path,
            continuations={
                "retention": {
                    "terminalMaxRecords": 3,
                    "terminalMaxAgeMs": 10_000_000,
                    "capturedTextMaxRecords": 1,
                    "capturedTextMaxAgeMs": 5_000,
                }
            },
        )
    )
    now = [int(time.time() * 1000)]
    async with afterword.open_service(
        config, environ=ENV, clock_ms=lambda: now[0], serve_http=False
    ) as service:
        captured = []
        for i in range(2):
            captured.append(await settle(service, "verification", f"cap-{i}", {"summary": f"captured {i}"}))
            now[0] += 10
        silent = [await settle(service, "background-index", f"quiet-{i}", {"n": i}) for i in range(2)]
        now[0] += 10

        compacted, dropped, _ = await service.apply_retention()
        # the two silent ones and the older capture are compacted; 3 tombstones fit the bound
        assert compacted == 3 and dropped == 0
        assert service.captured_continuation_text(captured[1]) == "From a background service: captured 1"
        assert service.captured_continuation_text(captured[0]) is None
        tomb = service.repo.tombstone(silent[0])
        assert tomb is not None and tomb.state == "delivered"

        # a tombstone still answers a repeated result idempotently, and refuses a different one
        from afterword.continuations.capabilities import result_token

        token = result_token(service._keys.result, silent[0])
        payload = {"n": 0}
        status = await service.submit_result(
            silent[0],
            token,
            ResultRequest(idempotency_key="k-quiet-0", payload_hash=payload_hash(payload), payload=payload),
            10,
        )
        # The snapshot is scrubbed with compaction; the context the record had stays beside it.
        assert status.compacted and status.state == "delivered" and status.origin_context == "scrubbed"
        assert status.origin_context_at_compaction == "detached_latest"
        other = {"n": 99}
        with pytest.raises(Conflict):
            await service.submit_result(
                silent[0],
                token,
                ResultRequest(idempotency_key="k-quiet-0", payload_hash=payload_hash(other), payload=other),
                10,
            )
        # a repeated claim maps to the same continuation and token
        from _service import DETACHED_TOKEN

        again = await service.detached_claim(
            "work-control",
            DETACHED_TOKEN,
            DetachedClaimRequest(
                route="background-index", task_key="quiet-0", task_hash="h-quiet-0", deadline=DEADLINE
            ),
        )
        assert again.continuation_id == silent[0] and again.result_token == token

        # captured text expires by age
        now[0] += 6_000
        compacted, dropped, _ = await service.apply_retention()
        assert compacted == 1 and service.captured_continuation_text(captured[1]) is None
        # now 4 tombstones exceed terminalMaxRecords=3: the oldest is dropped
        assert dropped == 1 and service.repo.tombstone(captured[0]) is None
        assert (await service.apply_retention())[:2] == (0, 0)  # idempotent

        listed = service.list_continuations()
        assert {i.continuation_id for i in listed.items} == {captured[1], *silent}


async def test_snapshot_blob_swept_after_compaction(tmp_path: Path) -> None:
    import httpx

    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV) as service:
        binding = service.begin_run("run-r", "slack:C9:T9#2026-11-29", "slack:C9:T9")
        env = binding.stdio_env("work-control")
        async with httpx.AsyncClient() as client:
            r = await client.post(
                env["MONO_AGENT_CONTINUATION_CLAIM_URL"],
                headers={"Authorization": "Bearer " + env["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]},
                json={"taskKey": "t", "taskHash": "h", "deadline": deadline()},
            )
            claim = r.json()
        await binding.close()
        digest = await binding.finalize(
            [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}]
        )
        assert digest is not None and digest in service.blobs
        await binding.activate()
        payload = {"summary": "finished"}
        await service.submit_result(
            claim["continuationId"],
            claim["resultToken"],
            ResultRequest(idempotency_key="k", payload_hash=payload_hash(payload), payload=payload),
            10,
        )
        cid = claim["continuationId"]
        await wait_for(
            lambda: service.repo.get(cid) is not None and service.repo.get(cid).state == "delivered"
        )  # type: ignore[union-attr]
        await service.apply_retention()
        assert digest not in service.blobs
        assert not (Path(config.state_dir) / "blobs" / digest).exists()
        status = service.status(cid, claim["resultToken"])
        assert status.compacted and status.origin_context == "scrubbed"  # the blob is gone...
        assert status.origin_context_at_compaction == "pinned"  # ...not the fact that it was pinned


async def test_tombstones_keep_attempt_counts(tmp_path: Path) -> None:
    """Compaction keeps the real synthesis/delivery attempts in status and list."""
    config = load(write_config(tmp_path))
    now = [int(time.time() * 1000)]
    async with afterword.open_service(
        config, environ=ENV, clock_ms=lambda: now[0], serve_http=False
    ) as service:
        cid = await settle(service, "daily-attention", "posted", {"summary": "posted once"})
        live = service.repo.get(cid)
        assert live is not None and live.attempts.synthesis == 1 and live.attempts.delivery == 1
        now[0] += 10
        compacted, _, _ = await service.apply_retention()
        assert compacted == 1 and service.repo.tombstone(cid) is not None
        from afterword.continuations.capabilities import result_token

        status = service.status(cid, result_token(service._keys.result, cid))
        assert status.compacted
        assert (status.attempts.synthesis, status.attempts.delivery) == (1, 1)
        (item,) = [i for i in service.list_continuations().items if i.continuation_id == cid]
        assert item.compacted and (item.attempts.synthesis, item.attempts.delivery) == (1, 1)


def test_retention_limits_take_each_configured_value_from_its_own_key(tmp_path: Path) -> None:
    from afterword.config import config_from_mapping
    from afterword.continuations.retention import RetentionLimits, retention_limits

    block = {
        "terminalMaxRecords": 11,
        "terminalMaxAgeMs": 22,
        "capturedTextMaxRecords": 33,
        "capturedTextMaxAgeMs": 44,
    }
    config = config_from_mapping({"continuations": {"retention": block}}, str(tmp_path))
    assert retention_limits(config.retention) == RetentionLimits(
        terminal_max_records=11,
        terminal_max_age_ms=22,
        captured_text_max_records=33,
        captured_text_max_age_ms=44,
    )

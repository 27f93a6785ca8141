"""Legacy v1/v2 migration into per-record-v3, the fence and the rollback guard."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from _legacy import GuardRefused, V010Runtime, fixture_records, interactive, record, write_v1, write_v2
from _service import ENV, load, outbox_lines, write_config

import afterword
from afterword.continuations import FALLBACK_TEXT
from afterword.continuations.model import decode_continuation
from afterword.legacy import MigrationError, open_state
from afterword.store import RecordStore

pytestmark = pytest.mark.timeout(120)


def setup(tmp_path: Path, **cont: Any) -> tuple[afterword.Config, Path]:
    config = load(write_config(tmp_path, continuations=cont or None))
    return config, Path(config.state_dir)


def migrate(config: afterword.Config, hook: Any = None) -> dict[str, Any]:
    store = RecordStore.open(config.state_dir)
    try:
        open_state(store, config, hook=hook)
        return {r.key: decode_continuation(r.value) for r in store.items("c/")}
    finally:
        store.close()


def by_legacy(records: dict[str, Any]) -> dict[str, Any]:
    return {r.legacy_id: r for r in records.values()}


def test_new_store_has_no_records_v2_until_first_native_record(tmp_path: Path) -> None:
    config, state = setup(tmp_path)

    async def run() -> None:
        async with afterword.open_service(config, environ=ENV, serve_http=False) as service:
            assert not (state / "records-v2").exists()
            from _service import DETACHED_TOKEN, deadline

            from afterword.protocol.wire import DetachedClaimRequest

            await service.detached_claim(
                "work-control",
                DETACHED_TOKEN,
                DetachedClaimRequest(
                    route="daily-attention", task_key="t", task_hash="h", deadline=deadline()
                ),
            )
            assert (state / "records-v2" / "ROLLBACK-GUARD").exists()
            assert service.store.manifest.guard_required

    anyio.run(run)
    with pytest.raises(GuardRefused):
        V010Runtime(state)


@pytest.mark.parametrize("layout", ["v1", "v2", "both"])
def test_migrates_each_state(tmp_path: Path, layout: str) -> None:
    config, state = setup(tmp_path)
    recs = fixture_records()
    if layout in ("v1", "both"):
        write_v1(state, recs)
    if layout in ("v2", "both"):
        write_v2(state, recs)
    first = migrate(config)
    migrated = by_legacy(first)
    # Stated here from the fixture's meaning, not computed by the migration code.
    assert {lid: (r.state, r.origin_context, r.claim.mode) for lid, r in migrated.items()} == {
        "r-pending": ("claimed", "detached_latest", "notify_if_actionable"),
        "r-received": ("result_received", "detached_latest", "notify_if_actionable"),
        "r-delivered": ("delivered", "detached_latest", "notify_if_actionable"),
        "r-dead": ("dead_lettered", "detached_latest", "notify_if_actionable"),
        "r-interactive": ("result_received", "legacy_missing", "reply"),
    }
    assert migrated["r-pending"].state == "claimed"
    assert migrated["r-received"].state == "result_received" and migrated["r-received"].result is not None
    assert migrated["r-delivered"].state == "delivered" and migrated["r-delivered"].receipt.delivery_ids == (
        "1700000000.1",
    )
    assert (
        migrated["r-dead"].state == "dead_lettered"
        and migrated["r-dead"].last_error.message == "permanent refusal"
    )
    inter = migrated["r-interactive"]
    assert inter.origin_context == "legacy_missing" and inter.history_boundary == 12
    assert inter.claim.conversation_id == "slack:C1:T1#2026-10-31"
    assert migrated["r-pending"].origin_context == "detached_latest"
    assert all(r.legacy for r in migrated.values())
    assert (state / "records-v2" / "ROLLBACK-GUARD").exists()
    store = RecordStore.open(config.state_dir)
    try:
        assert store.manifest.guard_required and store.manifest.meta["migration"] == "complete"
    finally:
        store.close()
    # legacy files are kept for audit; a second open changes nothing the first one produced
    assert (state / "continuations.json").exists() or layout == "v2"
    assert migrate(config) == first


STEPS = ["preflighted", "fenced", "batch-1", "batch-2", "before-manifest", "after-manifest"]


class Crash(Exception):
    pass


# What the fixture's records become, stated from their meaning (tests/_legacy.py), not computed
# by the migration: legacy id -> (state, origin context, accepted result's idempotency key and
# payload, text, receipt delivery ids, task key, mode).
MIGRATED = {
    "r-pending": (
        "claimed",
        "detached_latest",
        None,
        None,
        None,
        None,
        "task-r-pending",
        "notify_if_actionable",
    ),
    "r-received": (
        "result_received",
        "detached_latest",
        "key-r-received",
        {"summary": "result of r-received"},
        None,
        None,
        "task-r-received",
        "notify_if_actionable",
    ),
    "r-delivered": (
        "delivered",
        "detached_latest",
        "key-r-delivered",
        {"summary": "result of r-delivered"},
        "answer for r-delivered",
        ("1700000000.1",),
        "task-r-delivered",
        "notify_if_actionable",
    ),
    "r-dead": (
        "dead_lettered",
        "detached_latest",
        "key-r-dead",
        {"summary": "result of r-dead"},
        None,
        None,
        "task-r-dead",
        "notify_if_actionable",
    ),
    "r-interactive": (
        "result_received",
        "legacy_missing",
        "key-r-interactive",
        {"summary": "result of r-interactive"},
        None,
        None,
        "task-r-interactive",
        "reply",
    ),
}


def summary(records: dict[str, Any]) -> dict[str, Any]:
    return {
        r.legacy_id: (
            r.state,
            r.origin_context,
            r.result.idempotency_key if r.result else None,
            msgspec.json.decode(bytes(r.result.payload)) if r.result else None,
            r.text,
            r.receipt.delivery_ids if r.receipt else None,
            r.claim.task_key,
            r.claim.mode,
        )
        for r in records.values()
    }


@pytest.mark.parametrize("step", STEPS)
def test_crash_at_every_step_converges(tmp_path: Path, step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import afterword.legacy.migrate as mig

    monkeypatch.setattr(mig, "BATCH", 3)  # five records -> two batches
    config, state = setup(tmp_path)
    write_v1(state, fixture_records()[:3])
    write_v2(state, fixture_records()[2:])

    def hook(name: str) -> None:
        if name == step:
            raise Crash(name)

    with pytest.raises(Crash):
        migrate(config, hook)
    if step == "preflighted":
        assert not (state / "records-v2" / "ROLLBACK-GUARD").exists()
    recovered = migrate(config)
    # Compared with the stated outcome, not with a second run of the same migration code
    # (which would agree with itself however wrong it was).
    assert summary(recovered) == MIGRATED
    assert (state / "records-v2" / "ROLLBACK-GUARD").exists()


def _nothing_published(state: Path, config: afterword.Config) -> None:
    assert not (state / "records-v2").exists()
    store = RecordStore.open(config.state_dir)
    try:
        assert list(store.items("c/")) == [] and not store.manifest.guard_required
    finally:
        store.close()


def test_oversized_monolith_fails_closed(tmp_path: Path) -> None:
    config, state = setup(tmp_path)
    path = write_v1(state, fixture_records())
    with open(path, "r+b") as f:
        f.truncate(256 * 1024 * 1024 + 1)  # sparse: the size check must refuse before reading
    with pytest.raises(MigrationError, match=r"continuations.json: too_large"):
        migrate(config)
    _nothing_published(state, config)


def test_oversized_record_fails_closed(tmp_path: Path) -> None:
    config, state = setup(tmp_path)
    write_v1(state, [record("big", "delivered", text="x" * (2 * 1024 * 1024 + 10))])
    with pytest.raises(MigrationError, match="exceeds the v3 per-record limit"):
        migrate(config)
    _nothing_published(state, config)


def test_symlinked_monolith_fails_closed(tmp_path: Path) -> None:
    config, state = setup(tmp_path)
    real = write_v1(state, fixture_records())
    target = tmp_path / "elsewhere.json"
    real.rename(target)
    os.symlink(target, state / "continuations.json")
    with pytest.raises(MigrationError, match=r"continuations.json: symlink"):
        migrate(config)
    _nothing_published(state, config)


def test_permissive_monolith_fails_closed(tmp_path: Path) -> None:
    config, state = setup(tmp_path)
    path = write_v1(state, fixture_records())
    os.chmod(path, 0o644)
    with pytest.raises(MigrationError, match=r"continuations.json: permissive_mode"):
        migrate(config)
    _nothing_published(state, config)


def test_rollback_window_and_guard(tmp_path: Path) -> None:
    config, state = setup(tmp_path)
    write_v2(state, [record("a", "claimed")])

    def crash_after_fence(name: str) -> None:
        if name == "fenced":
            raise Crash(name)

    with pytest.raises(Crash):
        migrate(config, crash_after_fence)
    # v3 is still empty: an operator may remove the guard and run 0.10 once more
    (state / "records-v2" / "ROLLBACK-GUARD").unlink()
    old = V010Runtime(state)
    old.write(record("b", "result_received"))
    migrated = by_legacy(migrate(config))
    assert set(migrated) == {"a", "b"}
    assert (state / "records-v2" / "ROLLBACK-GUARD").exists()
    with pytest.raises(GuardRefused):
        V010Runtime(state)
    # with v3 records present, removing the guard makes the current runtime fail closed
    (state / "records-v2" / "ROLLBACK-GUARD").unlink()
    with pytest.raises(MigrationError, match="rollback guard missing while per-record-v5 records exist"):
        migrate(config)


def test_legacy_missing_delivered_with_fallback_and_no_model_call(tmp_path: Path) -> None:
    config, state = setup(tmp_path)
    write_v1(state, [interactive("old-1")])
    calls: list[Any] = []

    class Recording:
        async def synthesize(self, request: Any) -> str:
            calls.append(request)
            return "should not be used"

    async def run() -> None:
        async with afterword.open_service(
            config, environ=ENV, serve_http=False, synthesizer=Recording()
        ) as service:
            with anyio.fail_after(10):
                while True:
                    recs = list(service.repo.live())
                    if recs and recs[0].state == "delivered":
                        break
                    await anyio.sleep(0.02)
            rec = recs[0]
            assert rec.completion_kind == "origin_context_unavailable" and rec.text == FALLBACK_TEXT

    anyio.run(run)
    assert calls == []
    lines = outbox_lines(config)
    assert [line["text"] for line in lines] == [FALLBACK_TEXT]
    assert lines[0]["conversationId"] == "slack:C1:T1"


def test_terminal_legacy_records_answer_repeated_claims_and_results(tmp_path: Path) -> None:
    import httpx
    from _service import DETACHED_TOKEN, payload_hash

    config, state = setup(tmp_path)
    write_v1(state, [record("done", "delivered")])

    async def run() -> None:
        async with afterword.open_service(config, environ=ENV) as service, httpx.AsyncClient() as client:
            r = await client.post(
                service.base_url + "/v1/continuations/detached/claim",
                headers={
                    "Authorization": f"Bearer {DETACHED_TOKEN}",
                    "X-Mono-Agent-Service-Name": "work-control",
                },
                json={
                    "route": "daily-attention",
                    "taskKey": "task-done",
                    "taskHash": "hash-done",
                    "deadline": "2030-01-02T03:04:05.000Z",
                },
            )
            assert r.status_code == 200, r.text
            claim = r.json()
            payload = {"summary": "result of done"}
            body = {"idempotencyKey": "key-done", "payloadHash": payload_hash(payload), "payload": payload}
            auth = {"Authorization": "Bearer " + claim["resultToken"]}
            again = await client.put(claim["resultUrl"], headers=auth, json=body)
            assert again.status_code == 200 and again.json()["state"] == "delivered"
            other = {"summary": "different"}
            body2 = {"idempotencyKey": "key-done", "payloadHash": payload_hash(other), "payload": other}
            assert (await client.put(claim["resultUrl"], headers=auth, json=body2)).status_code == 409
            conflict = await client.post(
                service.base_url + "/v1/continuations/detached/claim",
                headers={
                    "Authorization": f"Bearer {DETACHED_TOKEN}",
                    "X-Mono-Agent-Service-Name": "work-control",
                },
                json={
                    "route": "daily-attention",
                    "taskKey": "task-done",
                    "taskHash": "other",
                    "deadline": "2030-01-02T03:04:05.000Z",
                },
            )
            assert conflict.status_code == 409

    anyio.run(run)


def test_migration_preflights_retention_tombstones(tmp_path: Path) -> None:
    """open_state runs the retention preflight: a tombstone that would not fit the store's
    per-record limit fails the migration before the fence or any record is written."""
    from afterword.store import StoreOptions

    config, state = setup(tmp_path)
    many_ids = [f"1700000000.{i:06d}" for i in range(800)]
    big = record(
        "big", "delivered", receipt={"deliveredAt": "2026-11-01T10:05:00.000Z", "deliveryIds": many_ids}
    )
    write_v1(state, [big, record("small", "dead_lettered")])
    store = RecordStore.open(config.state_dir, options=StoreOptions(max_record_bytes=8 * 1024))
    try:
        with pytest.raises(MigrationError, match=r"'big': its retention tombstone of \d+ bytes exceeds"):
            open_state(store, config)
    finally:
        store.close()
    _nothing_published(state, config)


def test_migrated_delivery_retry_is_scheduled_and_delivered(tmp_path: Path) -> None:
    """A legacy delivery_retry record gets a due next-attempt time and the worker delivers it
    without an operator."""
    config, state = setup(tmp_path)
    write_v1(state, [record("waiting", "delivery_retry", text="answer waiting for a retry")])

    async def run() -> None:
        async with afterword.open_service(config, environ=ENV, serve_http=False) as service:
            (rec,) = service.repo.live()
            with anyio.fail_after(10):
                while (cur := service.repo.get(rec.id)) is not None and cur.state != "delivered":
                    await anyio.sleep(0.02)

    anyio.run(run)
    assert [line["text"] for line in outbox_lines(config)] == ["answer waiting for a retry"]
    (rec,) = migrate(config).values()
    assert rec.state == "delivered" and rec.attempts.delivery == 1


def test_large_legacy_records_migrate_in_bounded_transactions(tmp_path: Path) -> None:
    """Six records of 1.5 MiB (9 MiB together, more than one transaction may hold) migrate."""
    config, state = setup(tmp_path)
    write_v1(state, [record(f"big-{i}", "delivered", text=f"{i}" + "x" * (1536 * 1024)) for i in range(6)])
    migrated = by_legacy(migrate(config))
    assert sorted(migrated) == [f"big-{i}" for i in range(6)]
    assert all(len(r.text) == 1536 * 1024 + 1 for r in migrated.values())

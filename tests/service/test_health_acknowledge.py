"""Health from facts an operator can change (issue 13 item 5), through the app handle and
the HTTP operator API: causes survive compaction, an acknowledgement clears them, and every
record is bounded by retention once nobody needs to act on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from _service import DETACHED_TOKEN, deadline
from fakes import Clock
from fakes.harness import make_config, running
from fakes.producer import reply_run, wait_state
from fakes.synth import ExplodingHistory

from afterword.continuations.errors import Conflict
from afterword.protocol.wire import DetachedClaimRequest

pytestmark = pytest.mark.anyio
DAY = 24 * 3600 * 1000
RETENTION = {"retention": {"terminalMaxAgeMs": DAY, "terminalMaxRecords": 100}}


async def http_health(service: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False) as client:
        r = await client.get(
            service.base_url + "/v1/operator/health",
            headers={"Authorization": "Bearer " + service.operator_token()},
        )
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    return body


async def http_acknowledge(service: Any, cid: str) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await client.post(
            service.base_url + f"/v1/operator/continuations/{cid}/acknowledge",
            headers={"Authorization": "Bearer " + service.operator_token()},
        )


def causes(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["code"]: c for c in body["causes"]}


async def test_history_unrecorded_survives_compaction_until_acknowledged(tmp_path: Path) -> None:
    clock = Clock()
    config, env = make_config(tmp_path, RETENTION)
    async with running(config, env, history=ExplodingHistory(), clock=clock) as h:
        svc = h.service
        claimed = await reply_run(svc, h.producer, {"summary": "done"})
        await wait_state(svc, claimed.id)
        compacted, _, _ = await svc.apply_retention()
        assert compacted == 1 and svc.repo.get(claimed.id) is None
        # compaction does not clear the signal (it did: health went back to healthy)
        body = await http_health(svc)
        assert body["status"] == "degraded" and body["historyUnrecorded"] == 1
        cause = causes(body)["history_unrecorded"]
        assert cause["ids"] == [claimed.id] and cause["count"] == 1
        assert cause["commands"] == [
            f"afterword continuations acknowledge --config {config.config_path} {claimed.id}"
        ]
        clock.advance(2 * DAY)  # nor does the tombstone's age
        await svc.apply_retention()
        assert svc.continuation_health().status == "degraded"
        r = await http_acknowledge(svc, claimed.id)
        assert r.status_code == 200 and r.json()["acknowledgedAt"] is not None
        health = svc.continuation_health()
        assert (health.status, health.causes, health.history_unrecorded) == ("healthy", [], 0)
        # once acknowledged, retention bounds it like any other record
        assert (await svc.apply_retention())[1] == 1 and svc.repo.tombstone(claimed.id) is None


async def test_expired_item_is_cleared_by_acknowledging_it(tmp_path: Path) -> None:
    clock = Clock()
    config, env = make_config(tmp_path, RETENTION)
    async with running(config, env, clock=clock) as h:
        svc = h.service
        claim = await svc.detached_claim(
            "work-control",
            DETACHED_TOKEN,
            DetachedClaimRequest(
                route="daily-attention", task_key="late", task_hash="h", deadline=deadline(0.5)
            ),
        )
        clock.advance(DAY)
        svc.work_available.set()
        cid = claim.continuation_id
        with anyio.fail_after(15):
            while (rec := svc.repo.get(cid)) is not None and rec.state != "expired":
                await anyio.sleep(0.05)
        await svc.apply_retention()  # compacted: the signal stays on the tombstone
        assert svc.repo.get(cid) is None and svc.repo.tombstone(cid) is not None
        clock.advance(300 * DAY)
        await svc.apply_retention()
        health = svc.continuation_health()
        assert health.status == "degraded" and [c.ids for c in health.causes] == [[cid]]
        status = await svc.acknowledge_continuation(cid)
        assert status.acknowledged_at is not None and status.compacted
        assert svc.continuation_health().status == "healthy"
        assert (await svc.apply_retention())[1] == 1  # and it is now bounded by retention


async def test_dead_letters_and_unknown_deliveries_are_bounded_once_handled(tmp_path: Path) -> None:
    from fakes import HANG, FakeWebhook, Reply

    clock = Clock()
    with FakeWebhook() as fake:
        fake.script(Reply(status=400), HANG)
        block = {
            **RETENTION,
            "limits": {"deliveryTimeoutMs": 1000},
            "channels": {
                "hook": {"adapter": "webhook", "url": fake.url + "/deliver"},
                "*": {"adapter": "outbox"},
            },
        }
        config, env = make_config(tmp_path, block)
        async with running(config, env, clock=clock) as h:
            svc = h.service
            dead = await reply_run(svc, h.producer, {"summary": "x"}, run_id="r1", reply_to="hook:a")
            assert (await wait_state(svc, dead.id)).state == "dead_lettered"
            unknown = await reply_run(svc, h.producer, {"summary": "y"}, run_id="r2", reply_to="hook:a")
            assert (await wait_state(svc, unknown.id)).state == "delivery_unknown"
            body = await http_health(svc)
            assert body["status"] == "unhealthy"
            assert causes(body)["dead_lettered"]["ids"] == [dead.id]
            (command,) = causes(body)["delivery_unknown"]["commands"]
            assert f" resolve --config {config.config_path} {unknown.id} " in command
            clock.advance(2 * DAY)
            assert (await svc.apply_retention())[:2] == (0, 0)  # both still need an operator
            r = await http_acknowledge(svc, unknown.id)
            assert r.status_code == 409 and "resolve" in r.json()["error"]["message"]
            pending = await svc.detached_claim(
                "work-control",
                DETACHED_TOKEN,
                DetachedClaimRequest(
                    route="daily-attention", task_key="p", task_hash="h", deadline=deadline(10)
                ),
            )
            with pytest.raises(Conflict, match="active"):
                await svc.acknowledge_continuation(pending.continuation_id)
            await svc.acknowledge_continuation(dead.id)
            await svc.resolve_continuation_delivery(unknown.id, {"kind": "dead_lettered"})
            health = svc.continuation_health()
            assert [(c.code, c.ids) for c in health.causes] == [
                ("dead_lettered", [unknown.id]),
                ("pending", [pending.continuation_id]),
            ]
            assert (await svc.apply_retention())[:2] == (1, 0)  # only the acknowledged one
            await svc.acknowledge_continuation(unknown.id)
            assert [c.code for c in svc.continuation_health().causes] == ["pending"]
            clock.advance(2 * DAY)
            compacted, dropped, _ = await svc.apply_retention()
            for cid in (dead.id, unknown.id):
                assert svc.repo.get(cid) is None and svc.repo.tombstone(cid) is None
            assert (compacted, dropped) == (1, 0)  # past the age bound: no tombstone is even written

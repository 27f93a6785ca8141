"""The continuation index fails closed when a committed record cannot be indexed."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest
from _service import DETACHED_TOKEN, ENV, deadline, load, write_config

import afterword
from afterword.app.repository import IndexCorrupt
from afterword.cli.doctor import diagnose
from afterword.protocol.wire import DetachedClaimRequest
from afterword.store import Put, RecordStore, StoreCorruptError

pytestmark = pytest.mark.anyio


async def test_bad_record_fails_closed_live_and_at_open(tmp_path: Path) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV) as service:
        claim = await service.detached_claim(
            "work-control",
            DETACHED_TOKEN,
            DetachedClaimRequest(route="daily-attention", task_key="t", task_hash="h", deadline=deadline()),
        )
        # A record under the continuation prefix that does not decode (a bug or tampering).
        await service.store.transact([Put("c/not-a-continuation", b"\xc1 not msgpack")])
        with pytest.raises(IndexCorrupt, match="not-a-continuation"):
            service.list_continuations()
        with pytest.raises(IndexCorrupt):
            service.status(claim.continuation_id, claim.result_token)
        with pytest.raises(IndexCorrupt):
            await service.detached_claim(
                "work-control",
                DETACHED_TOKEN,
                DetachedClaimRequest(
                    route="daily-attention", task_key="t2", task_hash="h", deadline=deadline()
                ),
            )
        async with httpx.AsyncClient(trust_env=False) as client:
            r = await client.get(
                service.base_url + "/v1/operator/continuations",
                headers={"Authorization": "Bearer " + service.operator_token()},
            )
            h = await client.get(
                service.base_url + "/v1/operator/health",
                headers={"Authorization": "Bearer " + service.operator_token()},
            )
        assert r.status_code == 500 and r.json()["error"]["code"] == "state_corrupt"
        assert h.status_code == 200 and h.json()["status"] == "unhealthy"
        assert h.json()["causes"][0]["code"] == "state_corrupt"
        # Health still answers, and says why: the bad record and the command to inspect it.
        health = service.continuation_health()
        assert health.status == "unhealthy"
        (cause,) = health.causes
        assert cause.code == "state_corrupt" and cause.ids == ["c/not-a-continuation"]
        assert cause.commands and cause.commands[0].startswith("afterword continuations doctor")
        # The read-only doctor names the same record while the service still runs.
        diagnosis = diagnose(str(config.state_dir))
        assert not diagnosis.healthy and diagnosis.rule == "record_undecodable"
        assert diagnosis.path == "c/not-a-continuation"
    # The next open refuses the state instead of serving a partial index.
    with pytest.raises(StoreCorruptError, match="cannot be indexed"):
        async with afterword.open_service(config, environ=ENV, serve_http=False):
            pass
    with RecordStore.open(config.state_dir) as store:  # the store itself is intact
        assert store.get("c/not-a-continuation") is not None
    await anyio.sleep(0)

"""``continuations.enabled: false`` disables every surface, embedded included (issue 13 item 4).

``open_service`` refuses a disabled configuration with the typed ``ServiceDisabled`` before it
opens the state directory or binds a port, so neither a detached HTTP claim nor a host run can
be admitted. A ``ContinuationService`` built directly on such a configuration refuses every
claim and ``begin_run`` with the same error (HTTP 410 ``closed``).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from _service import DETACHED_TOKEN, ENV, deadline, write_config

import afterword
from afterword.app.service import ContinuationService
from afterword.blobs import BlobStore
from afterword.continuations.errors import Closed
from afterword.http.app import create_app
from afterword.protocol.wire import DetachedClaimRequest
from afterword.store import RecordStore

pytestmark = pytest.mark.anyio


def disabled_config(root: Path) -> Path:
    return write_config(root, continuations={"enabled": False})


def refuses_connections(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) != 0


async def test_open_service_refuses_a_disabled_config_before_touching_anything(tmp_path: Path) -> None:
    path = disabled_config(tmp_path)
    config = afterword.load_config(path, environ=ENV)
    assert not config.enabled
    for target in (config, path):  # a Config or a path: the same refusal
        with pytest.raises(afterword.ServiceDisabled, match=r"continuations\.enabled is false"):
            async with afterword.open_service(target, environ=ENV):
                pytest.fail("a disabled service must not open")
    assert isinstance(afterword.ServiceDisabled(), Closed)
    assert not (tmp_path / "state").exists()  # no state directory created
    assert refuses_connections(config.port)  # nothing listens for claims


@asynccontextmanager
async def direct_service(root: Path) -> AsyncIterator[ContinuationService]:
    """A service composed by hand, bypassing open_service's refusal."""
    config = afterword.load_config(disabled_config(root), environ=ENV)
    store = RecordStore.open(config.state_dir)
    try:
        yield ContinuationService(config, store, BlobStore(store.root, store.secret), environ=ENV)
    finally:
        store.close()


async def test_a_directly_built_disabled_service_refuses_every_claim(tmp_path: Path) -> None:
    async with direct_service(tmp_path) as service:
        with pytest.raises(afterword.ServiceDisabled):
            service.begin_run("run-1", "slack:C1:T1#2030-01-01", "slack:C1:T1")
        request = DetachedClaimRequest(
            route="daily-attention", task_key="t", task_hash="h", deadline=deadline()
        )
        with pytest.raises(afterword.ServiceDisabled):
            await service.detached_claim("work-control", DETACHED_TOKEN, request)
        assert service.repo.active_total == 0


async def test_its_http_facade_answers_410_closed_to_both_claim_endpoints(tmp_path: Path) -> None:
    async with direct_service(tmp_path) as service:
        client = create_app(service).test_client()
        host = {"Host": f"127.0.0.1:{service.config.port}"}
        detached = await client.post(
            "/v1/continuations/detached/claim",
            headers={
                **host,
                "Authorization": f"Bearer {DETACHED_TOKEN}",
                "X-Mono-Agent-Service-Name": "work-control",
            },
            json={"route": "daily-attention", "taskKey": "t", "taskHash": "h", "deadline": deadline()},
        )
        bound = await client.post(
            "/v1/continuations/claim",
            headers={**host, "Authorization": "Bearer awc1.anything"},
            json={"taskKey": "t", "taskHash": "h", "deadline": deadline()},
        )
        for response in (detached, bound):
            assert response.status_code == 410
            body = await response.get_json()
            assert body["error"]["code"] == "closed" and "disabled" in body["error"]["message"]
        assert service.repo.active_total == 0

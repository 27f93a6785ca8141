"""The service meets the layers above it only through explicit registrations (issue 16):
nothing is patched onto it, and what it reads of a worker is what was registered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _claims import make_claim
from _service import ENV, write_config

from afterword.app.claims import Claims
from afterword.app.health import Health
from afterword.app.keys import ServiceKeys, ServiceUrls
from afterword.app.ledger import Ledger
from afterword.app.maintenance import Maintenance
from afterword.app.operator import Operator
from afterword.app.results import Results
from afterword.app.runs import Runs
from afterword.app.service import ContinuationService
from afterword.app.tasks import Tasks
from afterword.blobs import BlobStore
from afterword.config import load_config
from afterword.continuations import Continuation, ResultRecord
from afterword.continuations import lifecycle as lc
from afterword.http.metrics import render_metrics
from afterword.legacy import RollbackGuard
from afterword.store import RecordStore

NOW = 1_900_000_000_000


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ContinuationService]:
    config = load_config(write_config(tmp_path), environ=ENV)
    store = RecordStore.open(config.state_dir)
    try:
        yield ContinuationService(
            config, store, BlobStore(store.root, store.secret), clock_ms=lambda: NOW, environ=ENV
        )
    finally:
        store.close()


class RecordingWorker:
    """A stand-in for the worker, as the app sees one (``afterword.app.ports.WorkerHandle``)."""

    def __init__(self, depth: int, outcome: tuple[bool, str | None] = (True, None)) -> None:
        self.depth = depth
        self.outcome = outcome
        self.recorded: list[str] = []
        self.full_scans = 0

    @property
    def queue_depth(self) -> int:
        return self.depth

    async def record_history(self, rec: Continuation) -> tuple[bool, str | None]:
        self.recorded.append(rec.id)
        return self.outcome


async def _unknown(service: ContinuationService) -> Continuation:
    """A committed record whose post was never confirmed (``delivery_unknown``)."""
    rec = Continuation(
        claim=make_claim(created_at_ms=NOW - 1000, deadline_ms=NOW + 3_600_000),
        claim_mac="m",
        state="ready_to_deliver",
        origin_context="pinned",
        result=ResultRecord(idempotency_key="r1", payload_hash="a" * 64, payload=b"{}", received_at_ms=NOW),
        text="the answer",
        completion_kind="synthesized",
    )
    rec = lc.delivery_unknown(lc.begin_delivery(rec, NOW), "delivery_timeout", "no answer", NOW)
    await service.commit([(None, rec)])
    return rec


@pytest.mark.anyio
async def test_a_delivered_resolution_records_history_through_the_registered_worker(
    service: ContinuationService,
) -> None:
    rec = await _unknown(service)
    worker = RecordingWorker(depth=0, outcome=(False, "history_full"))
    service.register_worker(worker)
    body = await service.resolve_continuation_delivery(rec.id, {"kind": "delivered", "deliveryId": "EXT-1"})
    assert body.state == "delivered"
    assert worker.recorded == [rec.id]
    # What the worker answered is what the receipt keeps (the bare verdict would say recorded).
    stored = service.repo.get(rec.id)
    assert stored is not None and stored.receipt is not None
    assert (stored.receipt.history_recorded, stored.receipt.history_error_code) == (False, "history_full")


def test_metrics_read_the_queue_and_scans_of_the_registered_worker(service: ContinuationService) -> None:
    assert "afterword_worker_queue_depth 0.0" in render_metrics(service).decode()
    worker = RecordingWorker(depth=7)
    worker.full_scans = 3
    service.register_worker(worker)
    text = render_metrics(service).decode()
    assert "afterword_worker_queue_depth 7.0" in text and "afterword_worker_scans_total 3.0" in text


ROOMS = (
    Claims,
    Results,
    Tasks,
    Runs,
    Operator,
    Maintenance,
    Health,
    Ledger,
    ServiceKeys,
    ServiceUrls,
    RollbackGuard,
)


def test_the_handle_forwards_to_its_rooms_and_exposes_none(service: ContinuationService) -> None:
    # One rule (docs/design.md, Contracts: app handle): a caller uses the handle's methods; the
    # rooms behind them are private, so there is never a second way to the same operation.
    public = {name: getattr(service, name) for name in dir(service) if not name.startswith("_")}
    assert {name for name, value in public.items() if isinstance(value, ROOMS)} == set()
    held = {type(value) for value in vars(service).values()}
    assert set(ROOMS) <= held  # composed of the rooms, not a copy of them

"""Prometheus metrics for the operator API, read from live state at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..continuations.health import SEVERITY
from ..continuations.model import STATES
from ..wal.log import FSYNC_BUCKETS

if TYPE_CHECKING:
    from ..app.service import ContinuationService


class ServiceCollector(Collector):
    def __init__(self, service: ContinuationService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        by_state = GaugeMetricFamily("afterword_continuations", "Continuations by state", labels=["state"])
        for state in STATES:
            by_state.add_metric([state], svc.repo.state_counts.get(state, 0))
        yield by_state
        health = svc.continuation_health()
        yield GaugeMetricFamily(
            "afterword_health", "0 healthy, 1 degraded, 2 unhealthy", value=SEVERITY[health.status]
        )
        depth = svc.worker.queue_depth if svc.worker is not None else 0  # registered by open_service
        yield GaugeMetricFamily(
            "afterword_worker_queue_depth", "Continuations queued or in progress", value=depth
        )
        scans = svc.worker.full_scans if svc.worker is not None else 0
        yield CounterMetricFamily(
            "afterword_worker_scans", "Full scans of the live continuations by the worker loop", value=scans
        )
        acceptor = svc.http_server.acceptor if svc.http_server is not None else None
        if acceptor is not None:
            yield GaugeMetricFamily(
                "afterword_http_connections", "HTTP connections being served", value=acceptor.active
            )
            yield CounterMetricFamily(
                "afterword_http_connections_refused",
                "HTTP connections refused at the connection cap",
                value=acceptor.refused,
            )
            yield CounterMetricFamily(
                "afterword_http_accept_failures", "Failed accept() calls", value=acceptor.accept_failures
            )
        problem = svc.store.storage_problem()
        storage = GaugeMetricFamily(
            "afterword_storage_problem",
            "1 while writes to the state directory fail, by cause (storage_full, disk_failed)",
            labels=["cause"],
        )
        for cause in ("storage_full", "disk_failed"):
            storage.add_metric([cause], 1 if problem is not None and problem[0] == cause else 0)
        yield storage
        yield CounterMetricFamily(
            "afterword_storage_full_refusals",
            "Writes refused, with nothing changed, because the file system had no space",
            value=svc.store.root.storage_full_total,
        )
        wal = svc.store.wal.stats
        yield CounterMetricFamily(
            "afterword_wal_commits", "Transactions committed to the WAL", value=wal.commits
        )
        yield CounterMetricFamily("afterword_wal_batches", "Group-commit writes", value=wal.batches)
        buckets: list[tuple[str, float]] = []
        cumulative = 0
        for bound, count in zip(FSYNC_BUCKETS, wal.fsync_buckets, strict=False):
            cumulative += count
            buckets.append((repr(bound), cumulative))
        cumulative += wal.fsync_buckets[-1]
        buckets.append(("+Inf", cumulative))
        yield HistogramMetricFamily(
            "afterword_wal_fsync_seconds",
            "fdatasync latency of WAL group commits",
            buckets=buckets,
            sum_value=wal.fsync_seconds_total,
        )
        stats = svc.store.statistics()
        yield GaugeMetricFamily(
            "afterword_checkpoint_last_seconds",
            "Duration of the last checkpoint",
            value=stats.last_checkpoint_seconds,
        )
        yield CounterMetricFamily("afterword_checkpoints", "Checkpoints written", value=stats.checkpoints)
        yield GaugeMetricFamily(
            "afterword_recovery_seconds", "Duration of store open and replay", value=stats.recovery_seconds
        )


def render_metrics(service: ContinuationService) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(service))
    return generate_latest(registry)

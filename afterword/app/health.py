"""Health: the records' assessment plus the store's own write failure, as one answer whose
causes each name their ids and the command that clears them."""

from __future__ import annotations

import shlex

from ..config import Config
from ..continuations.health import assess
from ..protocol.wire import HealthBody, HealthCauseBody
from ..store import RecordStore
from .repository import IndexCorrupt, Repository

HEALTH_ID_LIMIT = 100  # ids listed per health cause; the count is always exact


class Health:
    def __init__(self, config: Config, store: RecordStore, repo: Repository) -> None:
        self.config = config
        self.store = store
        self.repo = repo

    def doctor_command(self) -> str:
        return "afterword continuations doctor" + (
            f" --config {shlex.quote(self.config.config_path)}" if self.config.config_path else ""
        )

    def storage_cause(self) -> HealthCauseBody | None:
        """The store's write failure as a health cause (it outranks every record cause)."""
        problem = self.store.storage_problem()
        if problem is None:
            return None
        code, _detail = problem
        if code == "storage_full" and self.store.root.failed is None:
            message = "the state directory's file system is full: writes are refused until space is freed"
        elif code == "storage_full":
            message = "a write failed for lack of space: free space, then restart the service"
        else:
            message = "a write or fsync to the state directory failed: fix the disk, then restart the service"
        return HealthCauseBody(
            code=code, status="unhealthy", count=1, message=message, ids=[], commands=[self.doctor_command()]
        )

    def continuation_health(self) -> HealthBody:
        """Health from the current records; each cause names its ids and the command that
        clears it."""
        storage = self.storage_cause()
        first = [storage] if storage is not None else []
        try:
            report = assess(
                self.repo.live(),
                self.repo.tombstone_summaries(),
                id_limit=HEALTH_ID_LIMIT,
                config_path=self.config.config_path,
            )
        except IndexCorrupt as exc:
            # Health must still answer (and say unhealthy) when the index refuses every read.
            corrupt = HealthCauseBody(
                code="state_corrupt",
                status="unhealthy",
                count=1,
                message="a committed record cannot be indexed: stop the service and check the state",
                ids=[exc.key] if exc.key else [],
                commands=[self.doctor_command()],
            )
            return HealthBody(
                status="unhealthy", counts={}, history_unrecorded=0, active=0, causes=[*first, corrupt]
            )
        return HealthBody(
            status="unhealthy" if storage is not None else report.status,
            counts=dict(report.counts),
            history_unrecorded=report.history_unrecorded,
            active=report.active,
            causes=first
            + [
                HealthCauseBody(
                    code=c.code,
                    status=c.status,
                    count=c.count,
                    message=c.message,
                    ids=list(c.ids),
                    commands=list(c.commands),
                    inspect=list(c.inspect),
                    alternatives=list(c.alternatives),
                    alternative_note=c.alternative_note,
                )
                for c in report.causes
            ],
        )

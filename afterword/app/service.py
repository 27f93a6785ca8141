"""ContinuationService: the app handle. It only composes the parts of the app.

- ``claims.py``: request-bound and detached claims, the header checks before a body is read
- ``results.py``: the producer's result and status
- ``runs.py`` (with ``binding.py``): the host's run bindings and their settlement
- ``operator.py``: list, show, captured text, retry, cancel, acknowledge, resolve
- ``maintenance.py``: recovery, parking, retention
- ``health.py``: the health answer, with the store's own write failure
- ``ledger.py``: the shared write path (locks, commit, transition, change listeners)
- ``keys.py``: every derived key and every URL

The HTTP facade and the CLI are thin layers over the methods here; the worker sees the service
only through :class:`afterword.app.ports.WorkerPorts` (docs/design.md, Layers). The handle
forwards: each room is a private attribute reached through one method here, never exposed
beside it (docs/design.md, Contracts: app handle).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..blobs import BlobStore
from ..config import Config
from ..continuations.errors import ServiceDisabled
from ..continuations.model import Continuation
from ..legacy.migrate import RollbackGuard
from ..protocol.tasks import TaskOutcome, TaskReport
from ..protocol.wire import (
    ClaimRequest,
    ClaimResponse,
    DetachedClaimRequest,
    DetailBody,
    HealthBody,
    HealthCauseBody,
    ListResponse,
    ResultRequest,
    StatusBody,
)
from ..store import Mutation, RecordStore
from .binding import CapabilityRegistry, RunBinding
from .claims import Claims, ServiceHooks
from .health import Health
from .keys import ServiceKeys, ServiceUrls
from .ledger import Ledger, WorkSignal
from .maintenance import Maintenance
from .operator import Operator, Resolution, ResolutionKind
from .ports import ChangeListener, FollowedTask, ServerHandle, Transition, WorkerHandle
from .repository import Repository
from .results import Results, open_payload_store
from .runs import CLAIM_CAPABILITY_TTL_MS, Runs
from .tasks import Tasks

__all__ = [
    "CLAIM_CAPABILITY_TTL_MS",
    "ContinuationService",
    "Resolution",
    "ResolutionKind",
    "ServiceHooks",
    "open_payload_store",
    "wall_clock_ms",
]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ContinuationService:
    """Durable continuations over one open state directory.

    Use :func:`afterword.open_service` to get one with its HTTP server and worker running.
    """

    def __init__(
        self,
        config: Config,
        store: RecordStore,
        blobs: BlobStore,
        *,
        payloads: BlobStore | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        token_bytes: Callable[[int], bytes] = secrets.token_bytes,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self._blobs = blobs
        self.payloads = payloads if payloads is not None else open_payload_store(store)
        self.clock_ms = clock_ms
        self.environ: Mapping[str, str] = environ if environ is not None else os.environ
        self._keys = ServiceKeys.derive(store.secret)
        self._urls = ServiceUrls(config.base_url)
        self.repo = Repository(store)
        self._rollback_guard = RollbackGuard(store)
        self._ledger = Ledger(store, self.repo, self._rollback_guard, clock_ms)
        capabilities = CapabilityRegistry()
        self._claims = Claims(config, self._ledger, self._keys, self._urls, capabilities, self.environ)
        self._results = Results(self._ledger, self._keys, self.payloads)
        self._tasks = Tasks(config, self._ledger, self._claims, self._results)
        self._runs = Runs(
            config, self._ledger, self._keys, self._urls, blobs, capabilities, token_bytes, self._tasks
        )
        self._operator = Operator(config, self._ledger, self._keys.cursor)
        self._maintenance = Maintenance(config, self._ledger, blobs, self.payloads)
        self._health = Health(config, store, self.repo)
        self.hooks: ServiceHooks = self._claims.hooks
        # Registered by runtime.open_service (never patched in): read by metrics.
        self.worker: WorkerHandle | None = None
        self.http_server: ServerHandle | None = None

    @property
    def blobs(self) -> BlobStore:
        """The origin snapshot store (replaceable, e.g. by a test that needs a small quota)."""
        return self._blobs

    @blobs.setter
    def blobs(self, blobs: BlobStore) -> None:
        self._blobs = self._runs.blobs = self._maintenance.blobs = blobs

    # -- composition -------------------------------------------------------------------------
    def register_worker(self, worker: WorkerHandle) -> None:
        """The running worker: metrics read its queue, and an operator-confirmed delivery is
        appended to the conversation history through it."""
        self.worker = worker
        self._operator.recorder = worker

    def register_server(self, server: ServerHandle) -> None:
        self.http_server = server

    # -- the write path (the worker's ports) ---------------------------------------------------
    @property
    def on_change(self) -> list[ChangeListener]:
        """Called as ``fn(old, new)`` after every committed change (a mutable list)."""
        return self._ledger.listeners

    def subscribe(self, listener: ChangeListener) -> None:
        self._ledger.listeners.append(listener)

    @property
    def work_available(self) -> WorkSignal:
        return self._ledger.work

    async def commit(
        self, pairs: Sequence[tuple[Continuation | None, Continuation]], *, extra: Sequence[Mutation] = ()
    ) -> None:
        await self._ledger.commit(pairs, extra=extra)

    async def transition(self, cid: str, fn: Transition) -> tuple[Continuation, bool]:
        return await self._ledger.transition(cid, fn)

    async def result_payload(self, rec: Continuation) -> bytes:
        return await self._results.result_payload(rec)

    def claim_intact(self, rec: Continuation) -> bool:
        return self._keys.claim_intact(rec)

    # -- urls and operator credentials --------------------------------------------------------
    @property
    def base_url(self) -> str:
        return self._urls.base_url

    @property
    def claim_url(self) -> str:
        return self._urls.claim_url

    def result_url(self, cid: str) -> str:
        return self._urls.result_url(cid)

    def status_url(self, cid: str) -> str:
        return self._urls.status_url(cid)

    def operator_token(self) -> str:
        return self._keys.operator_token()

    def verify_operator(self, token: str) -> None:
        self._keys.verify_operator(token)

    def verify_host(self, token: str) -> None:
        self._keys.verify_host(token)

    def verify_metrics_reader(self, token: str) -> None:
        self._keys.verify_metrics_reader(token)

    def status_page_key(self) -> bytes:
        """The key the status page derives its sign-in cookie's name from."""
        return self._keys.status_page

    # -- claims, results, status --------------------------------------------------------------
    def authenticate_claim(self, token: str) -> None:
        self._claims.authenticate_claim(token)

    def authenticate_detached(self, service_name: str, token: str) -> None:
        self._claims.authenticate_detached(service_name, token)

    def authenticate_result(self, cid: str, token: str) -> None:
        self._results.authenticate_result(cid, token)

    async def claim(self, token: str, req: ClaimRequest) -> ClaimResponse:
        return await self._claims.claim(token, req)

    async def detached_claim(self, service_name: str, token: str, req: DetachedClaimRequest) -> ClaimResponse:
        return await self._claims.detached_claim(service_name, token, req)

    async def submit_result(self, cid: str, token: str, req: ResultRequest, body_len: int) -> StatusBody:
        return await self._results.submit_result(cid, token, req, body_len)

    def status(self, cid: str, token: str) -> StatusBody:
        return self._results.status(cid, token)

    # -- runs ----------------------------------------------------------------------------------
    def begin_run(
        self, run_id: str, conversation_id: str, reply_to: str | None, mode: str = "reply"
    ) -> RunBinding:
        """Issue claim capabilities for one agent run (one per selected server).

        Raises ServiceDisabled when the configuration disables continuations: a host must not
        believe a run can carry continuations that nothing will ever admit.
        """
        if not self.config.enabled:
            raise ServiceDisabled()
        return self._runs.begin_run(run_id, conversation_id, reply_to, mode)

    # -- MCP Tasks bridge (the worker's follower sees these as ports.TaskFollowing) ---------
    async def report_task_outcome(
        self, cid: str, outcome: TaskOutcome, *, host_only: bool = False
    ) -> TaskReport:
        """Apply one answer of ``tasks/get`` to the task-backed continuation ``cid`` (the
        outcome table of docs/tasks-bridge.md); ``cancel`` asks the caller to send tasks/cancel.
        ``host_only``: refuse a service-followed task (the host API's route)."""
        return await self._tasks.report(cid, outcome, host_only=host_only)

    def tasks_to_follow(self) -> list[FollowedTask]:
        return self._tasks.tasks_to_follow()

    async def record_task_cancel_sent(self, cid: str, ok: bool, detail: str | None) -> None:
        await self._tasks.record_cancel_sent(cid, ok, detail)

    async def run_task_host_leases(self) -> None:
        """Apply host-lease lapses until cancelled (``open_service`` starts it)."""
        await self._tasks.run_host_leases()

    async def expire_task_host_leases(self) -> list[str]:
        """Dead-letter host-followed tasks whose host stopped reporting (``task_host_gone``)."""
        return await self._tasks.expire_host_leases()

    # -- maintenance and health ----------------------------------------------------------------
    async def recover(self) -> int:
        return await self._maintenance.recover()

    async def apply_retention(self) -> tuple[int, int, int]:
        return await self._maintenance.apply_retention()

    def storage_cause(self) -> HealthCauseBody | None:
        return self._health.storage_cause()

    def continuation_health(self) -> HealthBody:
        return self._health.continuation_health()

    # -- operator verbs ------------------------------------------------------------------------
    def list_continuations(
        self,
        limit: int | None = None,
        cursor: str | None = None,
        *,
        state: str | None = None,
        server: str | None = None,
        route: str | None = None,
        newest_first: bool = False,
    ) -> ListResponse:
        return self._operator.list_continuations(
            limit, cursor, state=state, server=server, route=route, newest_first=newest_first
        )

    def continuation_detail(self, cid: str) -> DetailBody:
        return self._operator.continuation_detail(cid)

    def captured_continuation_text(self, cid: str) -> str | None:
        return self._operator.captured_continuation_text(cid)

    async def retry_continuation(self, cid: str, allow_unknown: bool = False) -> StatusBody:
        return await self._operator.retry_continuation(cid, allow_unknown)

    async def cancel_continuation(self, cid: str) -> StatusBody:
        return await self._operator.cancel_continuation(cid)

    async def acknowledge_continuation(self, cid: str) -> StatusBody:
        return await self._operator.acknowledge_continuation(cid)

    async def resolve_continuation_delivery(
        self, cid: str, resolution: Resolution | Mapping[str, Any]
    ) -> StatusBody:
        return await self._operator.resolve_continuation_delivery(cid, resolution)

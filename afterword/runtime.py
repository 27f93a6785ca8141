"""``open_service``: the embedded app handle with its HTTP server and worker running.

This is the composition root: it sits above everything it composes (the service in
``app/``, the HTTP server, the worker, the legacy fence), so no package below has to reach up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from .app.hostruns import host_runs
from .app.ports import ChangeListener
from .app.service import ContinuationService, wall_clock_ms
from .app.statecheck import check_service_state
from .blobs import BlobStore
from .config import Config, load_config
from .continuations.errors import ServiceDisabled
from .history import ConversationHistory
from .http.server import HttpServer
from .legacy import open_state
from .legacy.migrate import v3_continuations
from .store import OwnershipLostError, RecordStore, StoreOptions

if TYPE_CHECKING:
    from .worker.channels import Channel
    from .worker.synthesizers import Synthesizer

__all__ = [
    "open_service",
]

log = logging.getLogger("afterword.service")


async def watch_ownership(store: RecordStore) -> None:
    """Re-check, every ``ownership_check_seconds``, that the state directory and its lock file
    are still the ones this process locked. When one was removed or replaced, another process
    may now open the directory: writes are refused from then on and the service stops with
    :class:`OwnershipLostError` (``serve`` exits non-zero)."""
    while True:
        await anyio.sleep(store.options.ownership_check_seconds)
        try:
            store.check_ownership()
        except OwnershipLostError as exc:
            log.error("store: %s; stopping: restart afterword after checking the state directory", exc)
            raise


@asynccontextmanager
async def open_service(
    config: Config | str | os.PathLike[str],
    *,
    synthesizer: Synthesizer | None = None,
    channels: Mapping[str, Channel] | None = None,
    history: ConversationHistory | None = None,
    serve_http: bool = True,
    run_worker: bool = True,
    clock_ms: Callable[[], int] = wall_clock_ms,
    environ: Mapping[str, str] | None = None,
    store_options: StoreOptions | None = None,
    on_change: Sequence[ChangeListener] = (),
) -> AsyncIterator[ContinuationService]:
    """Open the state directory, recover, serve HTTP and run the worker until exit.

    Raises ServiceDisabled (before touching the state directory) when the configuration sets
    ``continuations.enabled: false``.

    ``on_change`` callbacks are attached before startup recovery, so the state changes
    recovery makes (an interrupted synthesis dead-lettered, ...) reach them too.

    On exit the HTTP server stops admitting, in-flight work drains within a bound, and the
    store is closed (everything acknowledged is already durable). ``store_options`` exists for
    tests (the store's commit observer); production leaves the defaults.
    """
    if not isinstance(config, Config):
        config = load_config(config, environ=environ)
    if not config.enabled:
        # Disabled means no surface at all: no state opened, no port bound, no worker, so no
        # claim (request-bound or detached) can ever be admitted, exactly like `serve`.
        raise ServiceDisabled()
    store = RecordStore.open(config.state_dir, options=store_options)
    http: HttpServer | None = None
    try:
        open_state(store, config)  # fence and legacy migration come before any v3 work
        blobs = BlobStore(store.root, store.secret)
        service = ContinuationService(config, store, blobs, clock_ms=clock_ms, environ=environ)
        # The verdict doctor gives too (statecheck.py); open_state and the blob stores above
        # already applied the same functions, so this repeats them at the cost of an lstat per blob.
        check_service_state(
            store.root, store.manifest, v3_records=v3_continuations(store), live=service.repo.live()
        )
        from .worker.compose import attach_task_follower, attach_worker

        worker = attach_worker(service, synthesizer=synthesizer, channels=channels, history=history)
        # Polls the tasks the service follows itself; runs beside the worker, or not at all.
        follower = attach_task_follower(service, worker) if run_worker else None
        service.on_change.extend(on_change)  # before anything at startup changes a record
        # Deliveries a crash interrupted on a channel that can prove what it holds are
        # settled first; recovery then declares only the truly unprovable ones unknown.
        await worker.reconcile_interrupted()
        await service.recover()
        await service.apply_retention()
        if service.repo.tombstones_unsummarized:
            # The catalog held no summaries of these (written by an older version or a tool):
            # record them now, so that the next start reads no tombstone file. Only a speed-up:
            # a checkpoint refused for lack of space does not stop the start.
            try:
                await store.checkpoint()
            except Exception as exc:
                if store.root.failed is not None:
                    raise
                log.warning("store: no checkpoint to record tombstone summaries: %s", exc)
        http = HttpServer(service)
        service.register_server(http)  # metrics read its connection counts
        if serve_http:
            http.bind()  # outside the task group, so a busy port is a plain ServeError
        try:
            async with anyio.create_task_group() as tg:
                if serve_http:
                    await http.start(tg)
                    tg.start_soon(host_runs(service).run)  # leases of runs bound over HTTP
                # Hosts following MCP tasks, embedded or over HTTP, must keep reporting.
                tg.start_soon(service.run_task_host_leases)
                if run_worker:
                    await tg.start(worker.run)
                if follower is not None:
                    # After recovery: every task still followed is polled at once.
                    await tg.start(follower.run)
                tg.start_soon(watch_ownership, store)
                try:
                    yield service
                finally:
                    with anyio.CancelScope(shield=True):
                        if serve_http:
                            await http.stop()
                        if follower is not None:
                            await follower.stop()  # before the worker: its outcomes make work
                        await worker.stop()
                    tg.cancel_scope.cancel()
        except* OwnershipLostError as group:
            # The watcher stopped the service: the caller (serve) sees the store error itself.
            raise group.exceptions[0] from None
    finally:
        if http is not None:
            http.unbind()
        store.close()

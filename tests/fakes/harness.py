"""Open a real service (HTTP + worker) on a free loopback port, with a producer client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
from _service import ENV, outbox_lines, write_config

import afterword
from afterword import ContinuationService
from afterword.app.service import wall_clock_ms
from afterword.config import Config
from afterword.store import StoreOptions
from afterword.worker import Worker

from .producer import Producer


@dataclass
class Harness:
    service: ContinuationService
    producer: Producer
    config: Config
    environ: dict[str, str]

    @property
    def worker(self) -> Worker:
        worker: Worker = self.service.worker  # type: ignore[attr-defined]
        return worker

    def outbox(self) -> list[dict[str, Any]]:
        return outbox_lines(self.config)

    async def after_full_scan(self) -> None:
        await after_full_scan(self.worker)


async def after_full_scan(worker: Worker, timeout: float = 10.0) -> None:
    """Return once the running worker loop has dispatched a full scan that began after this
    call and every step it started has ended.

    Whatever the worker would do with the records as they stand now (even wrongly) has then
    been done, so a test can assert that nothing happened without guessing a duration.
    """
    seen = worker.full_scans
    with anyio.fail_after(timeout):
        while worker.full_scans <= seen or worker.queue_depth > 0:
            await anyio.sleep(0.005)


def make_config(
    root: Path, continuations: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Config, dict[str, str]]:
    env = {**ENV, **(environ or {})}
    return afterword.load_config(write_config(root, continuations=continuations), environ=env), env


@asynccontextmanager
async def running(
    config: Config,
    environ: Mapping[str, str],
    *,
    synthesizer: Any = None,
    channels: Mapping[str, Any] | None = None,
    history: Any = None,
    clock: Callable[[], int] = wall_clock_ms,
    run_worker: bool = True,
    store_options: StoreOptions | None = None,
) -> AsyncIterator[Harness]:
    async with (
        afterword.open_service(
            config,
            synthesizer=synthesizer,
            channels=channels,
            history=history,
            clock_ms=clock,
            environ=environ,
            run_worker=run_worker,
            store_options=store_options,
        ) as service,
        httpx.AsyncClient(timeout=10) as client,
    ):
        yield Harness(service, Producer(client), config, dict(environ))

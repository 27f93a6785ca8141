"""Resident memory of ``afterword serve`` holding 10,000 active continuations and 50,000 tombstones.

The state is written straight into the record store through a disk seam whose syncs do nothing
(:class:`afterword.disk.NoSyncDisk`): making 60,000 continuations through HTTP would take
minutes of fsyncs and measure nothing this figure reports. The records are the service's own
types, with real ids and claim MACs derived from the state directory's secret, so the service
opens, indexes and serves them as if producers had made them. The active ones are detached
claims waiting for a result (deadline a day away), the tombstones delivered ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from afterword.app.keys import ServiceKeys
from afterword.app.repository import LIVE, TOMB, Repository
from afterword.continuations.capabilities import continuation_id, fingerprint
from afterword.continuations.model import Claim, Continuation, Receipt, Tombstone, encode
from afterword.disk import NoSyncDisk
from afterword.store import Put, RecordStore

BATCH = 1000
SERVER = "work-control"


@dataclass
class RssFigure:
    active: int
    tombstones: int
    empty_rss_mib: float
    rss_mib: float
    open_seconds: float
    empty_open_seconds: float | None = None  # listening after, on the empty state


def _claim(keys: ServiceKeys, key: str, route: str, conversation: str, now_ms: int) -> Claim:
    mode = "notify_if_actionable"
    return Claim(
        id=continuation_id(keys.ids, "detached", SERVER, key),
        kind="detached",
        server_name=SERVER,
        run_id=None,
        conversation_id=conversation,
        reply_to=None,
        route=route,
        mode=mode,
        task_key=key,
        task_hash="h" + key,
        deadline_ms=now_ms + 86_400_000,
        fingerprint=fingerprint(None, SERVER, conversation, None, mode, route),
        created_at_ms=now_ms,
    )


def fill_state(
    state_dir: str, active: int, tombstones: int, route: str, conversation: str, *, summaries: bool = True
) -> None:
    """Add ``active`` waiting continuations and ``tombstones`` delivered tombstones to the store
    and checkpoint; ``summaries=False`` leaves the catalog without tombstone summaries, as a
    store last checkpointed by a version before them (the first start then reads every
    tombstone, and checkpoints)."""
    store = RecordStore.open(state_dir, disk=NoSyncDisk())
    try:
        keys = ServiceKeys.derive(store.secret)
        now_ms = int(time.time() * 1000)
        puts: list[Put] = []

        def flush() -> None:
            if puts:
                store.transact_sync(list(puts))
                puts.clear()

        for i in range(active):
            claim = _claim(keys, f"active-{i}", route, conversation, now_ms)
            rec = Continuation(
                claim=claim, claim_mac=keys.mac(claim), origin_context="detached_latest", updated_at_ms=now_ms
            )
            puts.append(Put(LIVE + claim.id, encode(rec)))
            if len(puts) >= BATCH:
                flush()
        for i in range(tombstones):
            claim = _claim(keys, f"done-{i}", route, conversation, now_ms)
            tomb = Tombstone(
                claim=claim,
                claim_mac=keys.mac(claim),
                state="delivered",
                idempotency_key=f"done-{i}",
                payload_hash="0" * 64,
                completion_kind="synthesized",
                receipt=Receipt(kind="captured", delivered_at_ms=now_ms, delivery_ids=(f"{claim.id}:0",)),
                terminal_at_ms=now_ms,
            )
            puts.append(Put(TOMB + claim.id, encode(tomb)))
            if len(puts) >= BATCH:
                flush()
        flush()
        if summaries:
            # As in a running service, whose checkpoints carry the tombstone summaries its
            # repository registered: the next start indexes tombstones without reading them.
            Repository(store)
        store.checkpoint_sync()
    finally:
        store.close()
    os.sync()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def serve_rss(config_path: Path, port: int, env: dict[str, str], repo: Path) -> tuple[float, float]:
    """Start ``afterword serve``, wait until it listens and settles; (RSS MiB, seconds to listen)."""
    from .e2e import wait_port

    began = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "afterword.cli", "serve", "--config", str(config_path)],
        env=env,
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_port(port, timeout=300)
        listening = time.perf_counter() - began
        await anyio.sleep(1.0)  # let startup maintenance and the worker's first pass run
        return rss_mib(proc.pid), listening
    finally:
        proc.terminate()
        proc.wait(30)

"""A DBOS Transact peer for ``bench.e2e``: what a user might pick instead of afterword.

A workflow stands for one continuation: it is started (the claim), waits in ``recv`` for a
message that a producer ``send``s to it (the result), then runs one step (the synthesis) and
returns (the delivery). The ``dbos`` package keeps its state in SQLite here (its system
database), with its notification polling tuned to 10 ms (see ``POLL``), in a scratch directory on the same disk as the other scenarios; ``inflight``
workflows run at once. It runs in a child process so DBOS's process-wide state stays out of
the others' way.
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import queue
import time
from pathlib import Path
from typing import Any

TOPIC = "result"
# On SQLite, DBOS has no LISTEN/NOTIFY: a workflow waiting in ``recv`` learns of a message by
# polling, every second by default, which would make its rate a function of that interval.
# 10 ms is what a user tuning it for latency would pick (the documented minimum is 1 ms).
POLL = 0.01


def _run(db_path: str, n: int, warmup: int, inflight: int, poll: float, out: Any) -> None:
    try:
        out.put(_measure(db_path, n, warmup, inflight, poll))
    except BaseException as exc:  # reported to the parent, which prints why
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def _measure(db_path: str, n: int, warmup: int, inflight: int, poll: float) -> dict[str, Any]:
    import anyio
    from dbos import DBOS

    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(
        config={
            "name": "afterword-bench",
            "system_database_url": f"sqlite:///{db_path}",
            "notification_listener_polling_interval_sec": poll,
        }
    )

    @DBOS.step()
    async def synthesize(payload: dict[str, Any]) -> str:
        return f"Task finished: {payload['summary']}"

    @DBOS.workflow()
    async def continuation(i: int) -> tuple[str, float]:
        payload = await DBOS.recv_async(TOPIC, timeout_seconds=600)
        text = await synthesize(payload)
        return text, time.time() * 1000

    DBOS.launch()
    latencies: list[float] = []

    async def batch(count: int, prefix: str, record: bool) -> None:
        indices = iter(range(count))

        async def worker() -> None:
            for i in indices:
                handle = await DBOS.start_workflow_async(continuation, i)
                sent = time.time() * 1000
                await DBOS.send_async(handle.workflow_id, {"summary": f"report {prefix}{i}"}, TOPIC)
                _, done = await handle.get_result(polling_interval_sec=poll)
                if record:
                    latencies.append(done - sent)

        async with anyio.create_task_group() as tg:
            for _ in range(inflight):
                tg.start_soon(worker)

    try:
        anyio.run(batch, warmup, "warm", False)
        began = time.perf_counter()
        anyio.run(batch, n, "run", True)
        return {"seconds": time.perf_counter() - began, "latencies_ms": sorted(latencies)}
    finally:
        DBOS.destroy()


def run_dbos(scratch: str, n: int, warmup: int, inflight: int, poll: float = POLL) -> dict[str, Any]:
    """Seconds for ``n`` workflows and their send-to-completion latencies, or ``{"error"}``."""
    if importlib.util.find_spec("dbos") is None:
        return {"error": "the dbos package is not installed (pip install -e '.[bench]')"}
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_run, args=(str(Path(scratch) / "dbos.sqlite"), n, warmup, inflight, poll, out))
    proc.start()
    result: dict[str, Any] | None = None
    while result is None:
        try:
            result = out.get(timeout=1)
        except queue.Empty:
            if not proc.is_alive():  # died before reporting (an import or start-up failure)
                try:
                    result = out.get(timeout=1)
                except queue.Empty:
                    result = {"error": f"the DBOS child exited with code {proc.exitcode} before reporting"}
        except Exception as exc:
            result = {"error": f"no result from the DBOS child: {type(exc).__name__}"}
    proc.join(30)
    if proc.is_alive():
        proc.terminate()
        proc.join(10)
    return result

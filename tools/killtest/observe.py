"""What the kill test watches while the load runs: terminal states as they happen, and RSS.

Retention may drop a record before the end of the run; a terminal state observed before
that is the evidence the verdict accepts for it (see ``verdict``). The observer polls each
continuation with an acknowledged result until it sees it terminal, at a bounded rate so it
never becomes the load.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from typing import Any

import httpx

from .verdict import TERMINAL, Seen


class StatusObserver:
    """Polls acknowledged continuations until terminal; ``seen`` holds what it observed."""

    def __init__(self, rate: float = 50.0, settle: float = 1.0) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.settle = settle  # a result is hardly terminal sooner; don't poll it before
        self.enabled = rate > 0
        self.seen: dict[str, Seen] = {}
        self.gone: set[str] = set()  # answered 404 at some point during the run
        self._queue: deque[tuple[float, str, str, str]] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, cid: str, status_url: str, token: str) -> None:
        if self.enabled:
            with self._lock:
                self._queue.append((time.monotonic() + self.settle, cid, status_url, token))

    def start(self) -> None:
        if self.enabled:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(timeout=5, trust_env=False) as client:
            while not self._stop.is_set():
                with self._lock:
                    item = (
                        self._queue.popleft()
                        if self._queue and self._queue[0][0] <= time.monotonic()
                        else None
                    )
                if item is None:
                    self._stop.wait(0.1)
                    continue
                _, cid, url, token = item
                try:
                    r = client.get(url, headers={"Authorization": "Bearer " + token})
                except httpx.HTTPError:
                    r = None  # the service is down (a kill): try again later
                if r is not None and r.status_code == 200:
                    seen = Seen.of(r.json())
                    if seen.state in TERMINAL:
                        self.seen[cid] = seen
                        item = None
                elif r is not None and r.status_code == 404:
                    self.gone.add(cid)
                    item = None
                if item is not None:
                    with self._lock:
                        self._queue.append((time.monotonic() + self.settle, cid, url, token))
                self._stop.wait(self.interval)


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class RssSampler:
    """Samples the resident set of whichever process ``pid()`` names, every ``period`` s."""

    def __init__(self, pid: Any, period: float = 0.5) -> None:
        self._pid = pid
        self.period = period
        self.samples: list[tuple[float, int]] = []  # (seconds since start, KiB)
        self._began = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._began = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            pid = self._pid()
            kib = rss_kib(pid) if pid else None
            if kib:
                self.samples.append((time.monotonic() - self._began, kib))

    def summary(self, buckets: int = 10) -> dict[str, Any]:
        """min/p50/max/last in MiB, and the peak in each tenth of the run (growth shows there)."""
        if not self.samples:
            return {}
        mib = [kib / 1024 for _, kib in self.samples]
        end = self.samples[-1][0] or 1.0
        peaks: list[float] = [0.0] * buckets
        for t, kib in self.samples:
            i = min(buckets - 1, int(t / end * buckets))
            peaks[i] = max(peaks[i], kib / 1024)
        return {
            "samples": len(mib),
            "min": round(min(mib), 1),
            "p50": round(statistics.median(mib), 1),
            "max": round(max(mib), 1),
            "last": round(mib[-1], 1),
            "peak_by_tenth": [round(p, 1) for p in peaks],
        }

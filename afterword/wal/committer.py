"""How the group-commit leader gets a batch written without stalling the event loop.

Three ways, chosen by ``WalOptions.commit_mode`` (``docs/performance.md`` has the figures):

``thread``
    ``anyio.to_thread.run_sync`` per batch: the generic worker pool (two cross-thread
    wake-ups and the pool's bookkeeping per batch).
``writer``
    One dedicated log-writer thread fed through a deque: the leader appends the batch and
    sets an event only if the writer sleeps; the writer spins briefly for the next batch
    before it sleeps, and hands the result back with one ``call_soon_threadsafe``.
``adaptive``
    ``writer``, except that a batch of one transaction that fits the tail segment is
    written inline, on the event loop itself, while the recent ``write+fdatasync`` time
    stays under ``inline_commit_max_s``: then the loop usually stalls for less than that
    bound, and the committer saves both hand-offs. A slow disk turns inline writing off by
    itself; an inline write that overran the bound turns it off for a back-off time too.

Whichever way, ``write_batch`` runs exactly once per batch and its error reaches the
waiters; a failed fdatasync is never retried (the root is poisoned by ``write_batch``).

The only clock-driven choice, inline or not, can be pinned for a harness that must repeat a run
exactly (``afterword.wal.testing.inline_by_batch_only``); the writing and acknowledging code
is the same either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import anyio

Items = Sequence[tuple[int, bytes]]

SPIN_SECONDS = 0.0002  # how long the writer looks for the next batch before it sleeps
_EWMA = 0.2  # weight of the newest write time in the running estimate
# After an inline write that overran the bound, no inline writing for this long (doubled on
# each overrun in a row, up to the cap): slow fdatasyncs come in bursts, and the running
# estimate alone comes back under the bound after a few fast writes, in the middle of one.
INLINE_BACKOFF_S = 0.05
INLINE_BACKOFF_MAX_S = 2.0

# Set through ``afterword.wal.testing.inline_by_batch_only`` (read when a committer is made):
# in ``adaptive`` the batch alone then decides inline or not, never the measured write time.
INLINE_BY_BATCH_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "afterword_wal_inline_by_batch_only", default=False
)


class LogWriter:
    """A dedicated thread that runs ``write(items)`` for batches handed to it in order."""

    def __init__(self, write: Callable[[Items], None], name: str = "afterword-wal-writer") -> None:
        self._write = write
        self._jobs: deque[tuple[Items, asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._wake = threading.Event()
        self._idle = False
        self._closed = False
        self._name = name
        self._thread: threading.Thread | None = None

    async def run(self, items: Items) -> None:
        """Write ``items`` in the writer thread and return (or raise) when that is done."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._jobs.append((items, loop, done))
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        elif self._idle:
            self._wake.set()
        await done

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        jobs, clock = self._jobs, time.perf_counter
        while True:
            if not jobs:
                deadline = clock() + SPIN_SECONDS
                while not jobs and clock() < deadline:
                    time.sleep(0)  # let the event loop thread have the GIL meanwhile
                if not jobs:
                    self._idle = True
                    self._wake.clear()
                    if not jobs and not self._closed:  # re-checked after clear(): no lost wake-up
                        self._wake.wait()
                    self._idle = False
                    if self._closed and not jobs:
                        return
                    continue
            items, loop, done = jobs.popleft()
            error: BaseException | None = None
            try:
                self._write(items)
            except BaseException as exc:  # handed to the waiting leader, never swallowed
                error = exc
            # A closed loop raises RuntimeError: its committers are gone, nobody waits any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, done, error)


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False  # another anyio backend: the generic thread pool serves it
    return True


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.cancelled():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


class Committer:
    """Runs the leader's ``write(items)`` in the configured way (see the module doc)."""

    def __init__(
        self,
        write: Callable[[Items], None],
        mode: str,
        inline_max_s: float,
        fits_tail: Callable[[Items], bool] = lambda items: True,
    ) -> None:
        self._write = write
        self._fits_tail = fits_tail
        self.mode = mode
        self.inline_max_s = inline_max_s
        self.recent_write_s = 0.0  # running estimate of one write+fdatasync, seconds
        self.inline_batches = 0
        self.inline_overruns = 0  # inline writes that stalled the loop longer than the bound
        self._inline_after = 0.0  # perf_counter time before which nothing is written inline
        self._backoff_s = INLINE_BACKOFF_S
        self._timing_decides = not INLINE_BY_BATCH_ONLY.get()
        self._writer = LogWriter(self._timed) if mode in ("writer", "adaptive") else None

    def _timed(self, items: Items) -> None:
        began = time.perf_counter()
        try:
            self._write(items)
        finally:
            elapsed = time.perf_counter() - began
            self.recent_write_s += _EWMA * (elapsed - self.recent_write_s)

    def write_inline(self, items: Items) -> bool:
        """Write ``items`` here, on the event loop, if this mode allows it for this batch now
        (``adaptive``, a batch of one, a fast disk); return whether it did. No await: the
        caller needs no cancel shield around it."""
        if self.mode != "adaptive" or len(items) != 1:
            return False
        timed = self._timing_decides
        if timed and self.recent_write_s > self.inline_max_s:
            return False
        began = time.perf_counter()
        if (timed and began < self._inline_after) or not self._fits_tail(items):
            # A batch that starts a segment life may create a slot (a zero fill of the whole
            # segment) and write the MANIFEST: far over the bound, so never on the loop.
            return False
        self.inline_batches += 1
        try:
            self._timed(items)  # on the loop: it stalls for about recent_write_s
        finally:
            ended = time.perf_counter()
            if ended - began > self.inline_max_s:
                self.inline_overruns += 1
                self._inline_after = ended + self._backoff_s
                self._backoff_s = min(2 * self._backoff_s, INLINE_BACKOFF_MAX_S)
            else:
                self._backoff_s = INLINE_BACKOFF_S
        return True

    async def write(self, items: Items) -> None:
        if self.write_inline(items):
            return
        if self._writer is not None and _on_asyncio():
            await self._writer.run(items)
            return
        await anyio.to_thread.run_sync(self._timed, items)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

"""How the group-commit leader gets a batch written without stalling the event loop.

One path. A batch of one transaction that fits the tail segment is written inline, on the
event loop itself, while the recent ``write+fdatasync`` time stays under
``WalOptions.inline_commit_max_s``: the loop then stalls for about that long at most, and a
lone committer saves the two thread hand-offs. Every other batch (several transactions, a new
segment life, a slow disk, or the back-off after an inline write overran the bound) is written
in anyio's worker thread, with the leader waiting shielded from cancellation.

A slow disk turns inline writing off by itself (the running estimate goes over the bound); an
inline write that overran the bound turns it off for a back-off time too, because slow flushes
come in bursts. Whichever way, ``write_batch`` runs exactly once per batch and its error
reaches the waiters; a failed fdatasync is never retried (``write_batch`` poisons the root).

The only clock-driven choice, inline or not, can be pinned for a harness that must repeat a
run exactly (``afterword.wal.testing.inline_by_batch_only``); the writing and acknowledging
code is the same either way.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Sequence

import anyio

Items = Sequence[tuple[int, bytes]]

_EWMA = 0.2  # weight of the newest write time in the running estimate
# After an inline write that overran the bound, no inline writing for this long (doubled on
# each overrun in a row, up to the cap): the running estimate alone comes back under the bound
# after a few fast writes, in the middle of a burst of slow ones.
INLINE_BACKOFF_S = 0.05
INLINE_BACKOFF_MAX_S = 2.0

# Set through ``afterword.wal.testing.inline_by_batch_only`` (read when a committer is made):
# the batch alone then decides inline or not, never the measured write time.
INLINE_BY_BATCH_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "afterword_wal_inline_by_batch_only", default=False
)


class Committer:
    """Runs the leader's ``write(items)`` inline or in a worker thread (see the module doc)."""

    def __init__(
        self,
        write: Callable[[Items], None],
        inline_max_s: float,
        fits_tail: Callable[[Items], bool] = lambda items: True,
    ) -> None:
        self._write = write
        self._fits_tail = fits_tail
        self.inline_max_s = inline_max_s
        self.recent_write_s = 0.0  # running estimate of one write+fdatasync, seconds
        self.inline_batches = 0
        self.inline_overruns = 0  # inline writes that stalled the loop longer than the bound
        self.longest_inline_s = 0.0  # the longest stall an inline write caused
        self._inline_after = 0.0  # perf_counter time before which nothing is written inline
        self._backoff_s = INLINE_BACKOFF_S
        self._timing_decides = not INLINE_BY_BATCH_ONLY.get()

    def _timed(self, items: Items) -> None:
        began = time.perf_counter()
        try:
            self._write(items)
        finally:
            elapsed = time.perf_counter() - began
            self.recent_write_s += _EWMA * (elapsed - self.recent_write_s)

    def write_inline(self, items: Items) -> bool:
        """Write ``items`` here, on the event loop, if this batch may be (a batch of one that
        fits the tail, a fast disk, no back-off); return whether it did. No await: the caller
        needs no cancel shield around it."""
        if len(items) != 1:
            return False
        timed = self._timing_decides
        if timed and self.recent_write_s >= self.inline_max_s:
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
            stalled = time.perf_counter() - began
            self.longest_inline_s = max(self.longest_inline_s, stalled)
            if stalled > self.inline_max_s:
                self.inline_overruns += 1
                self._inline_after = began + stalled + self._backoff_s
                self._backoff_s = min(2 * self._backoff_s, INLINE_BACKOFF_MAX_S)
            else:
                self._backoff_s = INLINE_BACKOFF_S
        return True

    async def write_off_loop(self, items: Items) -> None:
        """Write ``items`` in a worker thread; the caller shields this from cancellation."""
        await anyio.to_thread.run_sync(self._timed, items)

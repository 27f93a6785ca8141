"""Bounds, test switches and statistics of the write-ahead log."""

from __future__ import annotations

from dataclasses import dataclass, field

from .layout import SEGMENT_HEADER_SIZE, frame_size
from .shadow import SHADOW_OVERHEAD

MiB = 1024 * 1024

# fsync latency histogram bucket upper bounds, seconds (exponential, as etcd does).
FSYNC_BUCKETS: tuple[float, ...] = tuple(0.0001 * 2**i for i in range(16))


@dataclass(frozen=True)
class WalOptions:
    """Bounds and test hooks of the log.

    ``zero_fill`` writes real zeros into new segments so that later overwrites need no
    metadata flush; tests may turn it off to save time. ``unsafe_no_fsync`` skips fdatasync
    and exists only for measuring the cost of everything else (never for real data).
    """

    segment_size: int = 16 * MiB
    max_payload: int = 8 * MiB - 4096  # the largest frame and its shadow fit in a 16 MiB segment
    max_log_bytes: int = 64 * MiB
    zero_fill: bool = True
    unsafe_no_fsync: bool = False
    # A lone commit is written on the event loop while write+fdatasync stays under this bound,
    # which is then the loop's usual stall per commit; other batches go to a worker thread
    # (``committer.py``).
    inline_commit_max_s: float = 0.0005

    def __post_init__(self) -> None:
        if not self.inline_commit_max_s >= 0:
            raise ValueError("inline_commit_max_s must be a number of seconds, 0 or more")
        if self.segment_size < SEGMENT_HEADER_SIZE + 2 * frame_size(self.max_payload) + SHADOW_OVERHEAD:
            # Every write carries a shadow copy of itself (``shadow.py``), so that damage to
            # the last write is repaired from the copy instead of being cut as a torn write.
            raise ValueError(
                "segment_size must hold the segment header and the largest frame twice (frame + shadow)"
            )
        if self.segment_size % 8:
            raise ValueError("segment_size must be a multiple of 8")


@dataclass
class WalStatistics:
    commits: int = 0
    batches: int = 0
    fsyncs: int = 0
    bytes_written: int = 0  # everything written: frames, their shadows, segment headers
    frame_bytes: int = 0  # the log itself: bytes of the frames written
    max_batch: int = 0
    fsync_seconds_total: float = 0.0
    fsync_buckets: list[int] = field(default_factory=lambda: [0] * (len(FSYNC_BUCKETS) + 1))

    def observe_fsync(self, seconds: float) -> None:
        self.fsyncs += 1
        self.fsync_seconds_total += seconds
        for i, bound in enumerate(FSYNC_BUCKETS):
            if seconds <= bound:
                self.fsync_buckets[i] += 1
                return
        self.fsync_buckets[-1] += 1

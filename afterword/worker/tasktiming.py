"""When the task follower polls next: pure arithmetic on milliseconds (docs/task-following.md)."""

from __future__ import annotations

__all__ = [
    "ERROR_BACKOFF_FIRST_MS",
    "MAX_FAILED_POLLS",
    "MAX_POLL_MS",
    "MIN_POLL_MS",
    "error_delay_ms",
    "working_delay_ms",
]

MIN_POLL_MS = 250  # a server's pollIntervalMs of 0 cannot make afterword spin
MAX_POLL_MS = 60_000  # nor one of 10^9 make it stop looking until the deadline
UNHINTED_FIRST_MS = 1_000
ERROR_BACKOFF_FIRST_MS = 1_000
ERROR_BACKOFF_MAX_MS = 60_000
MAX_FAILED_POLLS = 5  # consecutive answers that break the protocol before giving up


def working_delay_ms(hint_ms: int | None, unhinted_streak: int) -> int:
    """After a ``working`` answer: the server's hint clamped to [250 ms, 60 s]; without one,
    1 s doubling per consecutive unhinted answer, up to 60 s."""
    if hint_ms is None:
        return min(MAX_POLL_MS, UNHINTED_FIRST_MS << min(max(unhinted_streak - 1, 0), 16))
    return max(MIN_POLL_MS, min(MAX_POLL_MS, hint_ms))


def error_delay_ms(errors: int, jitter: float) -> int:
    """After the ``errors``-th consecutive failed poll: 1 s doubling up to 60 s, shortened by up
    to a fifth (``jitter`` in [0, 1)) so tasks of one restarted server do not poll in step."""
    base = min(ERROR_BACKOFF_MAX_MS, ERROR_BACKOFF_FIRST_MS << min(max(errors - 1, 0), 16))
    return max(MIN_POLL_MS, int(base * (1 - 0.2 * min(max(jitter, 0.0), 1.0))))

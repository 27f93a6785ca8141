"""``serve``'s state-change log: one JSON line per change, written a loop tick at a time.

A detached continuation changes state five times; writing and flushing stderr for each line
cost about 3% of the event loop under load. Lines are collected instead, and the event loop
writes everything collected during one of its passes in a single call at the start of its
next pass.

Nothing else may overtake a collected line: every other writer to the same stream calls
:meth:`StateChangeLog.flush` first (the log handlers through :meth:`StateChangeLog.filter`,
``serve``'s own messages directly), and ``serve`` flushes on its way out, whether it stops,
fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time

import msgspec

from ..continuations.model import Continuation

_line = msgspec.json.Encoder()


class _Attempts(msgspec.Struct):
    synthesis: int
    delivery: int


class _Event(msgspec.Struct):
    """The line's fields in their order (a Struct encodes a quarter faster than a dict)."""

    ts: float
    event: str
    id: str
    from_: str | None = msgspec.field(name="from")
    to: str
    origin: str
    mode: str
    server: str
    attempts: _Attempts
    error: str | None


def state_change_line(old: Continuation | None, new: Continuation) -> bytes:
    """One structured log line per state change: ids and states only (no token, payload or text)."""
    event = _Event(
        ts=round(time.time(), 3),
        event="continuation",
        id=new.id,
        from_=old.state if old is not None else None,
        to=new.state,
        origin=new.origin_context,
        mode=new.claim.mode,
        server=new.claim.server_name,
        # Delivery attempts across operator retries, as status and `list` report them.
        attempts=_Attempts(
            synthesis=new.attempts.synthesis,
            delivery=new.delivery_attempts_before + new.attempts.delivery,
        ),
        error=new.last_error.code if new.last_error else None,
    )
    return _line.encode(event) + b"\n"


class StateChangeLog:
    """A change listener (``log(old, new)``) that writes state-change lines to stderr in batches.

    Outside a running asyncio loop (another thread, another backend) a line is written at once.
    The stream is looked up on every write, so a replaced ``sys.stderr`` is honoured.
    """

    def __init__(self) -> None:
        # Held while lines are taken *and* written, so two flushes cannot swap their lines'
        # order (a log record from another thread flushes too).
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._scheduled = False
        self.writes = 0  # how many writes reached the stream (for tests and benchmarks)

    def __call__(self, old: Continuation | None, new: Continuation) -> None:
        if old is None or old.state != new.state or old.origin_context != new.origin_context:
            self.add(state_change_line(old, new))

    def add(self, line: bytes) -> None:
        with self._lock:
            self._pending.append(line)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write every collected line now, in the order they were added."""
        with self._lock:
            self._scheduled = False
            if not self._pending:
                return
            data = b"".join(self._pending)
            self._pending.clear()
            try:
                sys.stderr.buffer.write(data)
                sys.stderr.flush()
            except (OSError, ValueError):
                # stderr is gone (closed, a broken pipe): the lines cannot be written anywhere,
                # and the commits they describe are durable, so this must not fail their callers.
                return
            self.writes += 1

    def filter(self, record: logging.LogRecord) -> bool:
        """A logging filter that lets every record through after flushing the collected lines,
        so a log record never appears before a state change that happened earlier."""
        self.flush()
        return True

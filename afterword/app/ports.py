"""The protocols between the app and the layers above it (docs/design.md, Layers).

The worker sits above the app: it gets an object implementing :class:`WorkerPorts` (the
service) and never reads the service's internals. What the app needs back from a running
worker (its queue depth for metrics, and appending an operator-confirmed delivery to the
conversation history) is :class:`WorkerHandle`, handed over explicitly with
``ContinuationService.register_worker``. The HTTP server registers itself the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import msgspec

from ..blobs import BlobStore
from ..config import Config
from ..continuations.model import Continuation
from ..protocol.tasks import TaskOutcome, TaskReport

ChangeListener = Callable[[Continuation | None, Continuation], None]
Transition = Callable[[Continuation], Continuation | None]


class RecordReader(Protocol):
    """Reads of the continuation index (``afterword.app.repository.Repository``)."""

    def get(self, cid: str) -> Continuation | None: ...

    def live(self) -> Iterable[Continuation]: ...


class WorkSignal(Protocol):
    """Set after every committed change; the worker waits on it between scans."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    async def wait(self, timeout_s: float) -> None: ...


class WorkerPorts(Protocol):
    """Everything the worker may ask of the app."""

    @property
    def config(self) -> Config: ...

    @property
    def repo(self) -> RecordReader: ...

    @property
    def blobs(self) -> BlobStore: ...

    @property
    def work_available(self) -> WorkSignal: ...

    def clock_ms(self) -> int: ...

    def subscribe(self, listener: ChangeListener) -> None:
        """Call ``listener(old, new)`` after every committed change."""

    async def transition(self, cid: str, fn: Transition) -> tuple[Continuation, bool]:
        """Apply a pure transition to one record under its lock; (record, changed)."""

    async def result_payload(self, rec: Continuation) -> bytes:
        """The accepted result's bytes, checked against their digests."""

    def claim_intact(self, rec: Continuation) -> bool:
        """Whether the record's immutable claim still matches its MAC."""

    async def apply_retention(self) -> tuple[int, int, int]: ...


class HistoryRecorder(Protocol):
    async def record_history(self, rec: Continuation) -> tuple[bool, str | None]:
        """Append the delivered answer to its conversation's history: (recorded, error code)."""


class WorkerHandle(HistoryRecorder, Protocol):
    """What the app reads of a running worker."""

    @property
    def queue_depth(self) -> int: ...

    full_scans: int  # full scans the loop has dispatched (the worker's liveness in metrics)


class AcceptStats(Protocol):
    @property
    def active(self) -> int: ...

    @property
    def refused(self) -> int: ...

    @property
    def accept_failures(self) -> int: ...


class ServerHandle(Protocol):
    """What the app (its metrics) reads of the HTTP server serving it."""

    @property
    def acceptor(self) -> AcceptStats | None: ...


class FollowedTask(msgspec.Struct, frozen=True, kw_only=True):
    """One task the service itself follows (``follow == "service"``): its continuation, the
    server's name and its loopback URL (read from the MCP config, never from a request), the
    task id, the continuation's deadline, the server's latest poll hint, and whether
    ``tasks/cancel`` is owed (then the record has ended: send it and record it, no polling)."""

    continuation_id: str
    server: str
    url: str
    task_id: str
    deadline_ms: int
    cancel_requested: bool
    poll_interval_ms: int | None = None


class TaskFollowing(Protocol):
    """What the worker's task follower may ask of the app (the service implements it)."""

    def tasks_to_follow(self) -> list[FollowedTask]:
        """Every service-followed task still waited on, and every one owed a tasks/cancel."""

    async def report_task_outcome(self, cid: str, outcome: TaskOutcome) -> TaskReport:
        """Apply one answer of tasks/get (the outcome table); the report says whether to
        send tasks/cancel."""

    async def record_task_cancel_sent(self, cid: str, ok: bool, detail: str | None) -> None:
        """Record the attempt to send an owed tasks/cancel (``detail``: why it failed)."""

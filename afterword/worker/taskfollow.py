"""The service's task follower: polls ``tasks/get`` for every task-backed continuation the
service follows itself (a loopback streamable-HTTP server), and hands each answer to the
service's outcome table (``report_task_outcome``).

Nothing about the polling schedule is durable: after a restart every task the service still
follows is polled at once, and the schedule is rebuilt from the answers. What is durable is
the service's (the outcome, the intent to cancel, whether ``tasks/cancel`` was sent).

Timing (docs/task-following.md; the delay rule is the core's ``poll_delay_ms``): after
``working``, the server's ``pollIntervalMs`` clamped to [250 ms, 60 s] (1 s without a hint);
after a failed poll, that delay doubled per consecutive failure up to 60 s, shortened at random
by up to a fifth; never a poll at or after the deadline (the service's expiry applies then).
Polls share the worker's concurrency limiter, each request is bounded in time, and the clock
and the sleep are injected so tests step deterministically.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ..app.ports import ChangeListener, FollowedTask, TaskFollowing
from ..config import McpServer
from ..continuations.errors import ContinuationError, InvalidTransition
from ..continuations.model import Continuation
from ..continuations.rules import MAX_RESULT_BODY
from ..continuations.taskoutcomes import MIN_POLL_MS, poll_delay_ms
from ..disk import DiskError
from ..protocol.headers import strip_reserved_headers
from ..protocol.taskanswers import (
    Answer,
    AnswerOverCap,
    Malformed,
    Unknown,
    Unreachable,
    clip,
    scrub,
    scrub_text,
    secrets_of,
)
from ..protocol.tasks import TaskOutcome
from ..store import VersionConflict

__all__ = ["MAX_ANSWER_BYTES", "REQUEST_TIMEOUT_S", "TaskFollower", "TaskWire", "follows_any", "load_wire"]

log = logging.getLogger("afterword.tasks.follow")
# A tasks/get answer carries the CallToolResult around the payload afterword keeps (at most
# MAX_RESULT_BODY): reading stops well past that and far below anything that hurts.
MAX_ANSWER_BYTES = 4 * MAX_RESULT_BODY + 64 * 1024
MAX_FAILED_POLLS = 5  # consecutive answers that break the protocol before giving up
REQUEST_TIMEOUT_S = 30.0
DRAIN_SECONDS = 5.0
TERMINAL = frozenset({"completed", "failed", "cancelled", "lost", "protocol_error", "too_large"})


class TaskWire(Protocol):
    """``tasks/get`` and ``tasks/cancel`` on one server (the SDK adapter, or a test's)."""

    async def get(self, url: str, headers: Mapping[str, str], task_id: str, timeout_s: float) -> Answer: ...

    async def cancel(
        self, url: str, headers: Mapping[str, str], task_id: str, timeout_s: float
    ) -> str | None:
        """``None`` when the server accepted the cancel, else why not (no secrets)."""


def follows_any(mcp_servers: Mapping[str, McpServer], continuation_servers: Iterable[str]) -> bool:
    """Whether a selected continuation server is one the service would follow (streamable
    HTTP; a stdio server's tasks are followed by the host that runs it)."""
    return any(s in mcp_servers and mcp_servers[s].transport == "http" for s in continuation_servers)


def load_wire() -> TaskWire | None:
    """The SDK 2.x adapter, or ``None`` when that line is not installed (the 1.x line has
    no tasks extension; without the SDK the service follows nothing)."""
    try:
        if int(version("mcp").split(".")[0]) != 2:
            return None
        module = import_module(f"{__package__}.taskwire")
    except (PackageNotFoundError, ValueError, ImportError):
        return None
    wire: TaskWire = module.McpTaskWire(max_answer_bytes=MAX_ANSWER_BYTES)
    return wire


@dataclass
class _Follow:
    task: FollowedTask
    due_ms: int
    failed_polls: int = 0  # consecutive answers that broke the protocol
    errors: int = 0  # consecutive polls without an answer (or a refused report)
    hint_ms: int | None = None  # the server's latest pollIntervalMs
    cancel_refusal: tuple[str | None] | None = None  # set once tasks/cancel was sent: (why refused)
    cancel_recorded: bool = False
    done: bool = False  # an ending was reported: nothing more to poll


class TaskFollower:
    """Follows the service's task-backed continuations. ``run`` is the loop; ``refresh`` and
    ``poll_due`` are the same steps for hosts and tests that drive it themselves."""

    def __init__(
        self,
        port: TaskFollowing,
        wire: TaskWire,
        *,
        mcp_servers: Mapping[str, McpServer] | None = None,
        limiter: anyio.CapacityLimiter,
        clock_ms: Callable[[], int],
        subscribe: Callable[[ChangeListener], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.port = port
        self.wire = wire
        self.mcp_servers = dict(mcp_servers or {})  # the configured headers of each server
        self.limiter = limiter
        self.clock_ms = clock_ms
        self.sleep = sleep
        self.jitter = jitter
        self.request_timeout_s = REQUEST_TIMEOUT_S
        self.follows: dict[str, _Follow] = {}
        self.in_flight: set[str] = set()
        self._wake = anyio.Event()
        self._stopping = False
        self._stopped = anyio.Event()
        self._running = False
        if subscribe is not None:
            subscribe(self._on_change)

    def _on_change(self, old: Continuation | None, new: Continuation) -> None:
        # A new adoption, a requested cancel, an ending: re-read the port at once (coalesced).
        # Other records' changes do not wake it: each re-read walks the live records.
        if new.task is not None and new.task.follow == "service":
            self._wake.set()

    # -- the steps ---------------------------------------------------------------------------
    def refresh(self) -> None:
        """Follow what the service says to follow: new tasks are due at once, tasks it no
        longer returns are dropped, a newly requested cancel is due at once."""
        now = self.clock_ms()
        current = {t.continuation_id: t for t in self.port.tasks_to_follow()}
        for cid in list(self.follows):
            if cid not in current:
                del self.follows[cid]
        for cid, task in current.items():
            follow = self.follows.get(cid)
            if follow is None:
                self.follows[cid] = _Follow(task, due_ms=now, hint_ms=task.poll_interval_ms)
            else:
                if task.cancel_requested and not follow.task.cancel_requested:
                    follow.due_ms = now
                follow.task = task

    def _due(self, now: int) -> list[_Follow]:
        return [
            f
            for cid, f in self.follows.items()
            if cid not in self.in_flight and f.due_ms <= now and self._wanted(f, now)
        ]

    def _wanted(self, follow: _Follow, now: int) -> bool:
        # A cancel the service says is owed is sent (and recorded) whatever ended the record,
        # even one this follower stopped polling; a poll only before the deadline.
        if follow.task.cancel_requested:
            return not follow.cancel_recorded
        return not follow.done and now < follow.task.deadline_ms

    def next_due_ms(self) -> int | None:
        now = self.clock_ms()
        due = [
            f.due_ms for cid, f in self.follows.items() if cid not in self.in_flight and self._wanted(f, now)
        ]
        return min(due) if due else None

    async def poll_due(self) -> list[str]:
        """Poll every due task once (concurrently, within the limiter) and return their ids."""
        now = self.clock_ms()
        due = self._due(now)
        async with anyio.create_task_group() as tg:
            for follow in due:
                self._start(tg, follow)
        return [f.task.continuation_id for f in due]

    def _start(self, tg: TaskGroup, follow: _Follow) -> None:
        self.in_flight.add(follow.task.continuation_id)
        tg.start_soon(self._step, follow)

    async def _step(self, follow: _Follow) -> None:
        cid = follow.task.continuation_id
        try:
            if follow.task.cancel_requested:
                await self._cancel(follow)
            else:
                await self._poll(follow)
        except (InvalidTransition, VersionConflict):
            # Someone else (an operator, the expiry) ended or changed the record first.
            follow.done = True
        except (ContinuationError, DiskError) as exc:
            log.warning("task follow %s: the outcome could not be recorded: %s", cid, type(exc).__name__)
            self._back_off(follow)
        except Exception as exc:
            # A bug or a surprise in the SDK must not stop the follower (nor the service): the
            # task is polled again later; its deadline still bounds how long.
            log.error("task follow %s: poll failed unexpectedly: %s", cid, type(exc).__name__)
            self._back_off(follow)
        finally:
            self.in_flight.discard(cid)
            self._wake.set()

    # -- one poll ----------------------------------------------------------------------------
    def _headers(self, task: FollowedTask) -> dict[str, str]:
        server = self.mcp_servers.get(task.server)
        return strip_reserved_headers(server.headers if server is not None else None)

    def _timeout_s(self, task: FollowedTask) -> float:
        left_s = (task.deadline_ms - self.clock_ms()) / 1000
        return max(0.1, min(self.request_timeout_s, left_s))

    def _capped(self, delay_ms: int, follow: _Follow) -> int:
        return min(self.clock_ms() + delay_ms, follow.task.deadline_ms)

    def _back_off(self, follow: _Follow) -> None:
        """After a failed poll: the poll delay doubled per consecutive failure (the core's
        rule), shortened at random by up to a fifth so that the tasks of one restarted server
        do not all poll again in step."""
        follow.errors += 1
        delay = poll_delay_ms(follow.hint_ms, follow.errors)
        shortened = int(delay * (1 - 0.2 * min(max(self.jitter(), 0.0), 1.0)))
        follow.due_ms = self._capped(max(MIN_POLL_MS, shortened), follow)

    async def _poll(self, follow: _Follow) -> None:
        task = follow.task
        headers = self._headers(task)
        async with self.limiter:
            answer = await self.wire.get(task.url, headers, task.task_id, self._timeout_s(task))
        answer = scrub(answer, secrets_of(headers))  # before anything is logged or recorded
        if isinstance(answer, Unreachable):
            self._back_off(follow)
            log.info("task follow %s: no answer (%s); retrying", task.continuation_id, answer.detail)
            return
        if isinstance(answer, Malformed):
            follow.failed_polls += 1
            log.warning(
                "task follow %s: failed poll %d of %d: %s",
                task.continuation_id,
                follow.failed_polls,
                MAX_FAILED_POLLS,
                answer.detail,
            )
            if follow.failed_polls >= MAX_FAILED_POLLS:
                await self._report(follow, TaskOutcome(status="protocol_error", message=answer.detail))
            else:
                self._back_off(follow)
            return
        if isinstance(answer, Unknown):
            await self._report(follow, TaskOutcome(status="lost", message=answer.message))
            return
        if isinstance(answer, AnswerOverCap):
            await self._report(
                follow,
                TaskOutcome(
                    status="too_large", message=f"the task's answer is longer than {answer.limit} bytes"
                ),
            )
            return
        follow.failed_polls = follow.errors = 0
        outcome = answer.outcome
        if outcome.status == "working":
            hint = outcome.poll_interval_ms
            follow.hint_ms = hint if hint is not None else follow.hint_ms
            follow.due_ms = self._capped(poll_delay_ms(follow.hint_ms), follow)
        await self._report(follow, outcome)

    async def _report(self, follow: _Follow, outcome: TaskOutcome) -> None:
        report = await self.port.report_task_outcome(follow.task.continuation_id, outcome)
        if outcome.status in TERMINAL or report.cancel:
            follow.done = True
        if report.cancel:
            await self._cancel(follow)

    async def _cancel(self, follow: _Follow) -> None:
        """Send ``tasks/cancel`` once and record how it went. A refusal is recorded, never
        retried; only the recording is tried again if the service could not take it."""
        task = follow.task
        if follow.cancel_refusal is None:
            # From here on never sent again by this process, whatever happens to this attempt.
            follow.cancel_refusal = ("the attempt to send tasks/cancel was interrupted",)
            headers = self._headers(task)
            async with self.limiter:
                refused = await self.wire.cancel(task.url, headers, task.task_id, self.request_timeout_s)
            if refused is not None:
                refused = clip(scrub_text(refused, secrets_of(headers)))
            follow.cancel_refusal = (refused,)
        (refused,) = follow.cancel_refusal
        await self.port.record_task_cancel_sent(task.continuation_id, refused is None, refused)
        follow.cancel_recorded = True

    # -- the loop ----------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._running = True
        try:
            async with anyio.create_task_group() as tg:
                task_status.started()
                while not self._stopping:
                    self._wake = anyio.Event()  # before the refresh: a change during it wakes us
                    try:
                        self.refresh()
                    except Exception as exc:
                        # Never take the service down: the tasks already known keep their
                        # schedule, and the next change signal tries again.
                        log.error("task follow: cannot read the tasks to follow: %s", type(exc).__name__)
                    for follow in self._due(self.clock_ms()):
                        self._start(tg, follow)
                    await self._sleep_or_wake(self.next_due_ms())
                with anyio.move_on_after(DRAIN_SECONDS):
                    while self.in_flight:
                        self._wake = anyio.Event()
                        await self._wake.wait()
                tg.cancel_scope.cancel()
        finally:
            self._stopped.set()

    async def _sleep_or_wake(self, due_ms: int | None) -> None:
        wake = self._wake
        if due_ms is None:
            await wake.wait()
            return
        delay_s = max(0.0, (due_ms - self.clock_ms()) / 1000)
        async with anyio.create_task_group() as tg:

            async def sleeper() -> None:
                await self.sleep(delay_s)
                tg.cancel_scope.cancel()

            async def waker() -> None:
                await wake.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(sleeper)
            tg.start_soon(waker)

    async def stop(self) -> None:
        """Stop polling; polls in flight get a short drain, then are cancelled."""
        self._stopping = True
        self._wake.set()
        if self._running:
            with anyio.move_on_after(DRAIN_SECONDS + 2):
                await self._stopped.wait()

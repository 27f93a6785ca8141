"""The host side of the MCP Tasks bridge: adopt task handles, follow host-followed tasks.

A server selected in ``tools.continuationServers`` may answer ``tools/call`` with a task
handle (``resultType: "task"``, SEP-2663) when the host declared the tasks extension. The host
helpers declare it only when the host passes a :class:`TaskHost` (and only to selected
servers, on SDK 2.x). On a handle they:

1. read it (a malformed handle becomes a tool error the model reads; nothing is adopted);
2. adopt it with the run's binding (``adopt_task``: the in-process ``RunBinding`` or a
   ``RemoteRun`` over the host API), which binds it to the run exactly like a claim;
3. answer the model with an ordinary tool result: the work was accepted and its answer will
   follow in this conversation. The text names the continuation id, never the task id: a
   server-made task id may be the only thing needed to read or cancel the task.

A task afterword follows itself (``follow: "service"``, a loopback HTTP server) needs nothing
more from the host. A task the host follows (``follow: "host"``, a stdio server whose process
lives with the host's session) is polled here with ``tasks/get`` for as long as the
:class:`TaskHost` lives, and each answer is reported (``report_task_outcome``); a ``working``
report renews the host's lease on it, and an answer ``{"cancel": true}`` makes the host send
``tasks/cancel``.

**Sessions outlive the turn.** With a :class:`TaskHost`, every MCP session of a turn is
opened inside a task the TaskHost owns. When the turn's ``connect_servers`` block ends, a
session with no task to follow closes at once; one that still has host-followed tasks stays
open, owned by the TaskHost, until each of them is terminal. A host keeps one TaskHost for
its lifetime (``async with TaskHost(service) as tasks:`` around its serving loop). When it
exits, or the host dies, the sessions end and no one reports: the service's host lease lapses
and the continuation is dead-lettered with the cause ``task_host_gone``, never left pending.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ..continuations import errors as E
from ..continuations.taskoutcomes import poll_delay_ms
from ..errors import AfterwordError, RemoteError
from ..protocol.tasks import AdoptedTask, TaskHandle, TaskOutcome, TaskReport
from .mcp_sdk import TaskChannelClosed, TaskUnknown, load
from .mcp_task_wire import MalformedTask, accepted_text, outcome_of, read_handle
from .mcp_task_wire import bounded as _bounded

__all__ = ["TaskAdopting", "TaskHost", "TaskReporting"]

log = logging.getLogger("afterword.mcp_host")
_sdk = load()

# Consecutive malformed tasks/get answers after which the task is reported ``protocol_error``
# (the service's follower gives up after as many).
PROTOCOL_ERROR_LIMIT = 5
REQUEST_TIMEOUT_S = 30.0
CANCEL_TIMEOUT_S = 10.0
# The longest wait between two polls (so between two reports) of one task: a third of the
# service's default host lease (taskHostLeaseMs, 60 s), so the reports on a task whose server
# asks to be polled rarely keep renewing the lease, and a failed poll is retried well within it.
RENEW_EVERY_S = 20.0
# Pauses before asking again when an adoption failed for a passing reason (unreachable, 5xx).
ADOPT_RETRY_S = (0.2, 1.0)

_TERMINAL_TASK = frozenset({"completed", "failed", "cancelled", "lost", "protocol_error", "too_large"})
_TERMINAL_RECORD = frozenset({"delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"})
_TOO_LARGE = "the task's result is larger than the host API accepts"


class _Refused(AfterwordError):
    """The service will never take this report (an internal signal of the follow loop)."""


class TaskAdopting(Protocol):
    """A run binding that can adopt a task: ``RunBinding`` or ``RemoteRun``."""

    async def adopt_task(self, server: str, handle: TaskHandle) -> AdoptedTask: ...


class TaskReporting(Protocol):
    """Who hears host-followed outcomes: ``ContinuationService`` or ``HostClient``."""

    async def report_task_outcome(self, cid: str, outcome: TaskOutcome) -> TaskReport: ...


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "code", type(exc).__name__))


def _retryable(exc: BaseException) -> bool:
    """A report that may succeed later: unreachable (status 0), 5xx, or over admission."""
    status = getattr(exc, "status", 500)
    return isinstance(exc, RemoteError) or status == 0 or status == 429 or status >= 500


def _transient(exc: BaseException) -> bool:
    """An adoption that may succeed if asked again at once: unreachable (status 0) or a 5xx
    other than 503 ``unavailable`` (the MCP SDK missing, which a retry does not install)."""
    status = getattr(exc, "status", 400)
    return (status == 0 or status >= 500) and getattr(exc, "code", "") != "unavailable"


def _poll_delay_s(interval_ms: int | None, failures: int) -> float:
    # The service follower's cadence: the hint clamped to [250 ms, 60 s] (a hostile 0 cannot
    # spin the host; 60 s stays inside the host lease), doubled per failed poll.
    return poll_delay_ms(interval_ms, failures) / 1000


@dataclass(eq=False)
class _Lease:
    """One MCP session owned by the TaskHost: held while its turn runs (``released`` unset)
    or while a host-followed task still needs it."""

    session: Any
    server: str
    secrets: tuple[str, ...] = ()
    released: anyio.Event = field(default_factory=anyio.Event)
    following: int = 0
    changed: anyio.Event = field(default_factory=anyio.Event)

    def touch(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


class TaskHost:
    """Adopts task handles for a host and follows the tasks afterword leaves to it.

    ``reporter`` hears each host-followed outcome: the embedded ``ContinuationService`` or a
    ``HostClient`` (``POST /v1/host/continuations/{cid}/task-outcome``). Use it as an async
    context manager that lives as long as the host, and pass it to
    ``connect_servers(..., tasks=...)`` on each turn. ``renew_every_s`` bounds the wait between
    two polls of a task: keep it under a third of ``continuations.limits.taskHostLeaseMs``.
    """

    def __init__(
        self,
        reporter: TaskReporting,
        *,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        renew_every_s: float = RENEW_EVERY_S,
    ) -> None:
        if not renew_every_s > 0 or not request_timeout_s > 0:
            raise ValueError("renew_every_s and request_timeout_s must be positive")
        self._reporter = reporter
        self._timeout = request_timeout_s
        self._renew_s = renew_every_s
        self._tg: TaskGroup | None = None
        self._leases: dict[int, _Lease] = {}
        self._following: set[str] = set()
        self.reported = 0
        self.cancels_sent = 0

    def __repr__(self) -> str:
        return (
            f"<TaskHost sessions={len(self._leases)} following={len(self._following)} "
            f"reported={self.reported} open={self._tg is not None}>"
        )

    @property
    def following(self) -> frozenset[str]:
        """The continuation ids whose tasks are being polled now."""
        return frozenset(self._following)

    @property
    def declares(self) -> bool:
        """Whether the installed SDK can declare the tasks extension (2.x)."""
        return bool(_sdk.TASKS)

    async def __aenter__(self) -> TaskHost:
        self._cm = anyio.create_task_group()
        self._tg = await self._cm.__aenter__()
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool | None:
        assert self._tg is not None
        # Leaving stops every follow and closes every session: what is left unreported falls
        # to the service's host-lease rule (task_host_gone).
        self._tg.cancel_scope.cancel()
        try:
            return await self._cm.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The host's own error, raised inside this block, reaches it as it was raised, not
            # wrapped in a group by our task group.
            if exc is not None and group.exceptions == (exc,):
                raise exc from None
            raise
        finally:
            self._tg = None

    # -- sessions -------------------------------------------------------------------------
    @asynccontextmanager
    async def session(
        self,
        server: str,
        opener: Callable[[list[Any]], AbstractAsyncContextManager[Any]],
        adopter: TaskAdopting | None,
        secrets: tuple[str, ...] = (),
    ) -> AsyncIterator[Any]:
        """Open a session in a task this TaskHost owns and yield it for one turn.

        ``opener(extensions)`` opens the session with those client extensions; ``adopter``
        is the run binding when the server is selected (None: nothing is declared);
        ``secrets`` are the values the server was handed (its claim token), removed from any
        message it sends back before that message is reported."""
        if self._tg is None:
            raise RuntimeError("TaskHost is not running: use 'async with TaskHost(...)'")
        lease: _Lease = await self._tg.start(self._own, server, opener, adopter, secrets)
        try:
            yield lease.session
        finally:
            lease.released.set()
            lease.touch()

    async def _own(
        self,
        server: str,
        opener: Callable[[list[Any]], AbstractAsyncContextManager[Any]],
        adopter: TaskAdopting | None,
        secrets: tuple[str, ...],
        *,
        task_status: TaskStatus[_Lease],
    ) -> None:
        holder: list[_Lease] = []

        async def on_handle(raw: dict[str, Any], tool: str) -> tuple[str, bool]:
            assert adopter is not None and holder
            return await self._adopt(holder[0], adopter, raw, tool)

        extensions = _sdk.tasks_extensions(on_handle) if adopter is not None else []
        started = False
        try:
            async with opener(extensions) as session:
                lease = _Lease(session=session, server=server, secrets=secrets)
                holder.append(lease)
                self._leases[id(lease)] = lease
                started = True
                task_status.started(lease)
                while not lease.released.is_set() or lease.following:
                    await lease.changed.wait()
        except Exception:
            if not started:
                raise
            # A session that broke after its turn began must not take the other sessions down.
            log.warning("an MCP session of %s ended with an error", server, exc_info=True)
        finally:
            if holder:
                self._leases.pop(id(holder[0]), None)

    # -- adoption -------------------------------------------------------------------------
    async def _adopt(
        self, lease: _Lease, adopter: TaskAdopting, raw: dict[str, Any], tool: str
    ) -> tuple[str, bool]:
        try:
            handle = read_handle(raw)
        except MalformedTask as exc:
            return (
                f"Not accepted: the tool server answered with a malformed task handle ({exc}). "
                "Nothing was started on afterword's side and no answer will follow.",
                True,
            )
        for pause in (*ADOPT_RETRY_S, None):
            try:
                adopted = await adopter.adopt_task(lease.server, handle)
                break
            except AfterwordError as exc:
                if pause is not None and _transient(exc):
                    # Adoption is idempotent per (run, server, task id): asking again is safe,
                    # and a sidecar that blinked must not cost the task (or orphan a record
                    # that did commit before its answer was lost).
                    await anyio.sleep(pause)
                    continue
                # Nobody will follow the task: ask the server to drop it rather than leave it running.
                await self._cancel(lease, handle.task_id)
                return (
                    f"Not accepted: afterword could not take this background task ({_code(exc)}); the "
                    "server was asked to cancel it and no answer will follow.",
                    True,
                )
        if adopted.follow == "host":
            self._start_follow(lease, adopted.continuation_id, handle)
        return accepted_text(tool, adopted.continuation_id), False

    # -- following ------------------------------------------------------------------------
    def _start_follow(self, lease: _Lease, cid: str, handle: TaskHandle) -> None:
        if cid in self._following:
            return  # an idempotent re-adoption of a task already followed
        assert self._tg is not None
        self._following.add(cid)
        lease.following += 1
        self._tg.start_soon(self._follow, lease, cid, handle)

    async def _follow(self, lease: _Lease, cid: str, handle: TaskHandle) -> None:
        try:
            await self._poll_until_done(lease, cid, handle)
        except Exception:
            # One task's failure must not stop the others or close the host's sessions; this
            # one's continuation is left to the host lease (task_host_gone).
            log.exception("following continuation %s failed; its host lease will decide", cid)
        finally:
            self._following.discard(cid)
            lease.following -= 1
            lease.touch()

    async def _poll_until_done(self, lease: _Lease, cid: str, handle: TaskHandle) -> None:
        interval = handle.poll_interval_ms
        failures = 0
        malformed = 0
        first = handle.status != "working"
        while True:
            if not first:
                await anyio.sleep(min(_poll_delay_s(interval, failures), self._renew_s))
            first = False
            try:
                raw = await _sdk.get_task(lease.session, handle.task_id, self._timeout)
                outcome = outcome_of(raw, handle.task_id, lease.secrets)
                malformed = 0
            except TaskUnknown:
                outcome = TaskOutcome(status="lost", message="the server no longer knows this task")
            except (
                TaskChannelClosed,
                anyio.ClosedResourceError,
                anyio.BrokenResourceError,
                anyio.EndOfStream,
            ):
                log.warning(
                    "the session following continuation %s ended; the service's host lease decides", cid
                )
                return
            except MalformedTask as exc:
                malformed += 1
                failures += 1
                if malformed < PROTOCOL_ERROR_LIMIT:
                    continue
                outcome = TaskOutcome(status="protocol_error", message=str(exc))
            except Exception as exc:  # a refused or timed-out poll: back off and poll again
                failures += 1
                log.info("tasks/get for continuation %s failed (%s)", cid, type(exc).__name__)
                continue
            if outcome.poll_interval_ms is not None:
                interval = outcome.poll_interval_ms
            try:
                report = await self._report(cid, outcome)
            except _Refused as refused:
                log.warning("continuation %s refused a task outcome (%s); following stops", cid, refused)
                return
            if report is None:
                failures += 1  # the service is unreachable or busy: poll again, report then
                continue
            self.reported += 1
            failures = 0
            if report.cancel:
                await self._cancel(lease, handle.task_id)
                return
            if outcome.status in _TERMINAL_TASK or report.state in _TERMINAL_RECORD:
                return

    async def _report(self, cid: str, outcome: TaskOutcome) -> TaskReport | None:
        """The service's answer; None when it may take the report later (unreachable, busy).
        Raises :class:`_Refused` when it never will."""
        try:
            return await self._reporter.report_task_outcome(cid, outcome)
        except E.RequestTooLarge:
            if outcome.status == "too_large":
                raise _Refused("too_large") from None
            # The result is bigger than the host API's body limit: say so instead, so the
            # continuation ends task_result_too_large rather than waiting for the lease.
            return await self._report(cid, TaskOutcome(status="too_large", message=_TOO_LARGE))
        except (RemoteError, E.ContinuationError) as exc:
            if _retryable(exc):
                return None
            if isinstance(exc, E.InvalidRequest) and outcome.status not in ("working", "protocol_error"):
                # The service cannot take this answer as it stands (a result nested past the
                # host API's limit, say). Say so, so the continuation ends with that cause now
                # instead of waiting out the host lease as task_host_gone.
                why = _bounded(f"the service refused the task's answer: {exc}")
                return await self._report(cid, TaskOutcome(status="protocol_error", message=why))
            raise _Refused(_code(exc)) from None

    async def _cancel(self, lease: _Lease, task_id: str) -> None:
        """``tasks/cancel``, best effort and bounded: a failure is logged, never raised."""
        with anyio.move_on_after(CANCEL_TIMEOUT_S):
            try:
                await _sdk.cancel_task(lease.session, task_id, CANCEL_TIMEOUT_S)
                self.cancels_sent += 1
                return
            except Exception as exc:
                log.warning("tasks/cancel failed (%s)", type(exc).__name__)
                return
        log.warning("tasks/cancel timed out")

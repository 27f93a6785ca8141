"""The MCP Tasks bridge in the app: adoption of a task handle as a task-backed continuation,
outcomes applied through the pure table (:mod:`afterword.continuations.taskoutcomes`), the
owed ``tasks/cancel``, and the host's lease on the tasks it follows (docs/tasks-bridge.md).

Adoption is a claim in every respect that matters: it is admitted under the run's claim
capability for that server (bound to the run, the server, the exact origin bucket, the reply
route and the mode), counts against the same admission limits, joins the run's claims, and is
settled by the same finalize / activate / abandon (and recovered like one after a crash).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

import anyio

from ..config import Config
from ..config.mcp import is_loopback_url
from ..continuations import taskoutcomes as table
from ..continuations.capabilities import continuation_id
from ..continuations.errors import Conflict, InvalidRequest, NotFound, RunClosed, Unavailable
from ..continuations.jcs import NotCanonical, canonical_json
from ..continuations.model import INLINE_PAYLOAD_MAX, Continuation, ResultRecord, TaskBacking
from ..continuations.rules import MAX_RESULT_BODY, canonical_hash
from ..continuations.taskcancel import owes_cancel
from ..protocol.tasks import (
    AdoptedTask,
    Follow,
    TaskHandle,
    TaskOutcome,
    TaskReport,
    check_handle,
    check_outcome,
)
from .binding import IssuedCapability
from .claims import Claims, bound_claim
from .leases import check_interval_s
from .ledger import Ledger
from .ports import FollowedTask
from .results import Results

log = logging.getLogger("afterword.tasks")

SDK_EXTRA = "afterword[mcp]"
# What a reporter may see of a task that has not ended on its server.
_STILL_RUNNING = frozenset({"working", "input_required"})


def mcp_sdk_available() -> bool:
    """Whether the MCP SDK the service's task follower needs is installed: the 2.x line (the
    1.x line has no tasks extension). Reads the package's metadata, imports nothing."""
    try:
        major = version("mcp").split(".")[0]
        return major == "2" and importlib.util.find_spec("mcp") is not None
    except (PackageNotFoundError, ImportError, ValueError):
        return False


def task_identity(run_id: str, task_id: str) -> tuple[str, str]:
    """The claim's taskKey and taskHash of a task adopted in ``run_id``: one continuation per
    (run, server, task id), whatever characters the server put in its id."""
    digest = hashlib.sha256(f"{run_id}\x00{task_id}".encode("utf-8", "surrogatepass")).hexdigest()
    return "mcp-task:" + digest[:48], digest


def _payload_bytes(payload: dict[str, object]) -> bytes | None:
    try:
        return canonical_json(payload)
    except (NotCanonical, RecursionError):  # no RFC 8785 form, or nested past any sense
        return None


class Tasks:
    """Adoption, outcomes, cancel records and host leases of task-backed continuations."""

    def __init__(self, config: Config, ledger: Ledger, claims: Claims, results: Results) -> None:
        self.config = config
        self.ledger = ledger
        self.repo = ledger.repo
        self.claims = claims
        self.results = results
        # Replaceable by a test that needs the SDK to be missing.
        self.sdk_available: Callable[[], bool] = mcp_sdk_available
        # follow "host": continuation id -> the end of its host's lease. In memory, like run
        # leases: a restarted service gives every such task one full lease from its start.
        self.host_leases: dict[str, int] = {}

    # -- adoption --------------------------------------------------------------------------
    def follow_of(self, server: str) -> Follow:
        entry = self.config.mcp_servers.get(server)
        if entry is not None and entry.transport == "stdio":
            return "host"
        if entry is not None and entry.transport == "http" and entry.url and is_loopback_url(entry.url):
            if not self.sdk_available():
                raise Unavailable(
                    f"following the tasks of the HTTP server {server} needs the MCP SDK 2.x: install {SDK_EXTRA}"
                )
            return "service"
        raise InvalidRequest(
            f"server {server} is not a stdio or loopback streamable-HTTP server of the MCP config"
        )

    def _repeat(self, cap: IssuedCapability, cid: str, task_id: str) -> AdoptedTask | None:
        existing = self.repo.get(cid) or self.repo.tombstone(cid)
        if existing is None:
            return None
        if existing.task is None or existing.task.task_id != task_id or existing.claim.run_id != cap.run_id:
            raise Conflict("this task was already adopted as a different continuation")
        return AdoptedTask(continuation_id=cid, follow=existing.task.follow)

    async def adopt(self, cap: IssuedCapability, handle: TaskHandle) -> AdoptedTask:
        """Adopt ``handle`` under ``cap`` (one server's authority in one run). Idempotent per
        (run, server, task id); refused once the run is closed (:class:`RunClosed`)."""
        self.claims.require_enabled()
        check_handle(handle)
        task_key, task_hash = task_identity(cap.run_id, handle.task_id)
        cid = continuation_id(self.claims.keys.ids, "mcp-task", cap.server_name, task_key)
        if cid in cap.claim_ids and (done := self._repeat(cap, cid, handle.task_id)) is not None:
            return done  # a repeat answers the same, even after close
        if cap.closed:
            raise RunClosed(f"run {cap.run_id} is closed: a task cannot join it any more")
        follow = self.follow_of(cap.server_name)
        cap.enter()  # no await between the closed check and this: close() waits for us
        try:
            now = self.ledger.clock_ms()
            if now > cap.expires_at_ms:
                raise RunClosed(f"run {cap.run_id} is closed: its claim capability expired")
            ttl = handle.ttl_ms if handle.ttl_ms else None
            span = (
                min(self.config.limits.task_deadline_ms, ttl) if ttl else self.config.limits.task_deadline_ms
            )
            claim = bound_claim(
                cap, cid, task_key=task_key, task_hash=task_hash, deadline_ms=now + span, now=now
            )
            backing = TaskBacking(
                task_id=handle.task_id,
                follow=follow,
                status=handle.status,
                poll_interval_ms=handle.poll_interval_ms,
                ttl_ms=handle.ttl_ms,
            )
            await self.claims.admit(claim, "pending", task=backing)
            if cid not in cap.claim_ids:
                cap.claim_ids.append(cid)
            if follow == "host":
                self.host_leases.setdefault(cid, now + self.config.limits.task_host_lease_ms)
        finally:
            cap.leave()
        log.info("continuation %s adopted task of %s (follow %s)", cid, cap.server_name, follow)
        return AdoptedTask(continuation_id=cid, follow=follow)

    # -- outcomes --------------------------------------------------------------------------
    def _report(self, rec: Continuation) -> TaskReport:
        return TaskReport(state=rec.state, cancel=owes_cancel(rec.task))

    async def report(self, cid: str, outcome: TaskOutcome, *, host_only: bool = False) -> TaskReport:
        """Apply ``outcome`` to the task-backed continuation ``cid`` (the outcome table).
        ``host_only``: refuse a service-followed task (the host API's route)."""
        check_outcome(outcome)
        rec = self.repo.get(cid)
        if rec is None:
            tomb = self.repo.tombstone(cid)
            if tomb is None:
                raise NotFound(f"no continuation {cid}")
            if tomb.task is None:
                raise Conflict(f"continuation {cid} is not backed by an MCP task")
            log.info("continuation %s: late task outcome %s ignored (compacted)", cid, outcome.status)
            # Compaction keeps the task: a host that still sees a cancelled task running is
            # told to cancel it, as it would have been before the record was compacted.
            task = tomb.task
            cancel = task.follow == "host" and task.cancel_requested and outcome.status in _STILL_RUNNING
            return TaskReport(state=tomb.state, cancel=cancel)
        if rec.task is None:
            raise Conflict(f"continuation {cid} is not backed by an MCP task")
        if host_only and rec.task.follow != "host":
            raise Conflict(f"continuation {cid}'s task is followed by the service, not by a host")
        now = self.ledger.clock_ms()
        decision = table.decide(rec, outcome, now)
        canonical: bytes | None = None
        if decision.kind == "accept" and decision.payload is not None:
            # RFC 8785 text is built in Python (tens of ms near the limit): off the event loop.
            # A task reports its result once, so the thread hop costs nothing that matters.
            canonical = await anyio.to_thread.run_sync(_payload_bytes, decision.payload)
            if canonical is None:
                decision = table.TaskDecision(
                    kind="dead_letter",
                    status=decision.status,
                    code="task_protocol_error",
                    message="the task's result has no canonical JSON form (RFC 8785)",
                )
            else:
                decision = table.sized(decision, len(canonical), MAX_RESULT_BODY)
        if rec.task.follow == "host" and rec.state == "claimed":
            self.host_leases[cid] = now + self.config.limits.task_host_lease_ms
        if decision.kind in ("ignore", "working"):
            if decision.kind == "ignore" and rec.terminal:
                log.info("continuation %s: late task outcome %s ignored (%s)", cid, outcome.status, rec.state)
            return await self._answer(rec, outcome.status)
        result = await self._result_record(rec, canonical, now) if decision.kind == "accept" else None
        try:
            new = await self._commit(cid, decision, result)
        finally:
            if result is not None and result.payload_digest is not None:
                self.results.payloads.unpin(result.payload_digest)
        log.info("continuation %s: task %s -> %s", cid, outcome.status, new.state)
        return await self._answer(new, outcome.status)

    async def _result_record(self, rec: Continuation, canonical: bytes | None, now: int) -> ResultRecord:
        assert canonical is not None and rec.task is not None
        digest = None
        if len(canonical) > INLINE_PAYLOAD_MAX:
            # Out of line, written and fsynced before the record that references it commits.
            digest = await anyio.to_thread.run_sync(self.results.payloads.put, canonical)
        return ResultRecord(
            idempotency_key=table.idempotency_key(rec.task.task_id),
            payload_hash=canonical_hash(canonical),
            payload=b"" if digest is not None else canonical,
            received_at_ms=now,
            payload_digest=digest,
            payload_size=len(canonical) if digest is not None else None,
        )

    async def _commit(
        self, cid: str, decision: table.TaskDecision, result: ResultRecord | None
    ) -> Continuation:
        async with self.ledger.locked([cid]):
            rec = self.repo.get(cid)
            if rec is None:
                raise NotFound(f"no continuation {cid}")
            now = self.ledger.clock_ms()
            # Applied only if the record still waits: another outcome (or expiry) may have won.
            waiting = rec.state == "claimed" and now <= rec.claim.deadline_ms
            new = table.apply(rec, decision, now, result) if waiting else None
            if new is None:
                return rec
            await self.ledger.commit([(rec, new)])
            if new.terminal or new.state != "claimed":
                self.host_leases.pop(cid, None)
            return new

    async def _answer(self, rec: Continuation, status: str) -> TaskReport:
        """The report for ``rec``, whose task the reporter just saw in ``status``. Telling a
        host to send tasks/cancel hands it the cancel: that is recorded (the host has no other
        way to report). The host may never have read that answer (a lost response, a service
        that died after the commit), so any later report of a task that still runs is asked
        again: tasks/cancel twice is harmless, never sent at all leaves the work running."""
        report = self._report(rec)
        task = rec.task
        if task is None or task.follow != "host":
            return report
        if report.cancel:
            await self.record_cancel_sent(rec.id, True, "handed to the host to send")
        elif task.cancel_requested and status in _STILL_RUNNING:
            report = TaskReport(state=rec.state, cancel=True)
        return report

    async def record_cancel_sent(self, cid: str, ok: bool, detail: str | None) -> None:
        def mark(r: Continuation) -> Continuation | None:
            return table.record_cancel_sent(r, ok, detail, self.ledger.clock_ms())

        try:
            await self.ledger.transition(cid, mark)
        except NotFound:
            return  # compacted meanwhile: nothing left to record it on
        if not ok:
            log.warning("continuation %s: tasks/cancel failed", cid)

    # -- the follower's view and the host leases ---------------------------------------------
    def tasks_to_follow(self) -> list[FollowedTask]:
        out = []
        for rec in self.repo.live():
            task = rec.task
            if task is None or task.follow != "service":
                continue
            owed = owes_cancel(task)
            if rec.state != "claimed" and not owed:
                continue
            entry = self.config.mcp_servers.get(rec.claim.server_name)
            if entry is None or entry.url is None or entry.transport != "http":
                continue  # the server left the MCP config: the record expires at its deadline
            out.append(
                FollowedTask(
                    continuation_id=rec.id,
                    server=rec.claim.server_name,
                    url=entry.url,
                    task_id=task.task_id,
                    deadline_ms=rec.claim.deadline_ms,
                    cancel_requested=owed,
                    poll_interval_ms=task.poll_interval_ms,
                )
            )
        return out

    async def expire_host_leases(self) -> list[str]:
        """Dead-letter (``task_host_gone``) every host-followed task whose host made no report
        within its lease. A task first seen here (after a restart) gets one full lease."""
        now = self.ledger.clock_ms()
        lease = self.config.limits.task_host_lease_ms
        due = []
        waiting = set()
        for rec in self.repo.live():
            if rec.task is None or rec.task.follow != "host" or rec.state != "claimed":
                continue
            waiting.add(rec.id)
            until = self.host_leases.setdefault(rec.id, now + lease)
            if now >= until:
                due.append((rec.id, until))
        for cid in [c for c in self.host_leases if c not in waiting]:
            del self.host_leases[cid]  # ended some other way (cancelled, expired): no lease left
        gone = []
        for cid, until in due:

            def lapse(r: Continuation, until: int = until) -> Continuation | None:
                return table.host_gone(r, until, now)

            try:
                _, changed = await self.ledger.transition(cid, lapse)
            except NotFound:
                continue
            self.host_leases.pop(cid, None)
            if changed:
                gone.append(cid)
                log.warning("continuation %s: its host stopped reporting on the task (task_host_gone)", cid)
        return gone

    async def run_host_leases(self) -> None:
        """Apply host-lease lapses until cancelled (started by ``open_service``)."""
        interval = check_interval_s(self.config.limits.task_host_lease_ms)
        while True:
            try:
                await self.expire_host_leases()
            except Exception as exc:  # a failing disk must not stop the loop (or the service)
                log.error("task host leases: %s", type(exc).__name__)
            await anyio.sleep(interval)


__all__ = ["SDK_EXTRA", "Tasks", "mcp_sdk_available", "task_identity"]

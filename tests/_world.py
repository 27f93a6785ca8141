"""The world the whole-service stateful test drives: one state directory, the real service
opened over it with ``open_service`` (real loopback HTTP, the worker driven step by step), a
fixed clock, the scripted channel and synthesizer, and the model of what producers, hosts and
operators were told. The rules live in ``test_service_stateful.py``; this module owns
opening, crashing and reopening, the public calls, and the invariant checks.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from _service import DETACHED_TOKEN, ENV, free_port, write_config
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fakes.scripted import KillSwitch, ScriptedChannel, ScriptedHistory, ScriptedSynth

import afterword
from afterword import ContinuationService
from afterword.app.binding import RunBinding
from afterword.config import channel_allows
from afterword.continuations.model import Continuation, Tombstone, decode_continuation
from afterword.history import DurableHistory
from afterword.store import MAX_RECORD_BYTES, StoreOptions, TransactionInfo
from afterword.wal import WalOptions
from afterword.worker import Worker

T = TypeVar("T")
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SERVER = "work-control"
TERMINAL = frozenset({"delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"})
ACTIVE = frozenset({"claimed", "result_received", "synthesizing", "ready_to_deliver", "delivery_retry"})
# What an accepted result may end as (I3); ``cancelled`` only by an operator's hand.
RESULT_ENDS = frozenset({"delivered", "dead_lettered", "delivery_unknown", "cancelled"})
ROUTES = ("daily-attention", "verification", "background-index")
DEFAULT_WAL = WalOptions()


def _scratch_parent() -> str | None:
    """tmpfs when there is one: the service fsyncs every commit, and on tmpfs that is free."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class Violation(AssertionError):
    """An invariant of issue 13 failed."""


@dataclass
class Stats:
    """Figures of one or many runs of the machine (the long run reports them)."""

    examples: int = 0
    steps: int = 0
    restarts: int = 0
    crashes: int = 0
    opens_after_crash_in_recovery: int = 0
    claims: int = 0
    results: int = 0
    posts: int = 0
    transactions: int = 0
    largest_transaction: int = 0
    operator_calls: int = 0
    unsafe_retries: int = 0
    races: int = 0  # operator verbs sent while a post was held in flight
    race_refusals: int = 0  # of those, refused with 409 naming why
    ends: Counter[str] = field(default_factory=Counter)  # how accepted results ended

    def add(self, other: Stats) -> None:
        for name in self.__dataclass_fields__:
            if name == "ends":
                self.ends.update(other.ends)
            elif name == "largest_transaction":
                self.largest_transaction = max(self.largest_transaction, other.largest_transaction)
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Run:
    """One host run: its binding lives only as long as the process that issued it."""

    run_id: str
    conversation_id: str
    reply_to: str | None
    mode: str
    binding: RunBinding | None
    env: dict[str, str]  # what the selected server was handed at run start
    phase: str = "open"  # open closed finalized activated abandoned dead
    keys: list[str] = field(default_factory=list)

    @property
    def host_alive(self) -> bool:
        return self.binding is not None and self.phase not in ("activated", "abandoned", "dead")


@dataclass
class Task:
    """One claimed continuation, as its producer knows it."""

    cid: str
    token: str
    result_url: str
    status_url: str
    kind: str
    mode: str
    run: Run | None
    body: bytes | None = None  # the accepted submission, byte for byte (for repeats)
    acked: bool = False
    epoch: int = 0  # successful unsafe retries (each allows one more post of every chunk)
    states: list[str] = field(default_factory=list)  # every state committed, in order

    @property
    def unproven(self) -> bool:
        """A post of this answer was ever of unknown outcome (the record was delivery_unknown)."""
        return "delivery_unknown" in self.states


class World:
    """Everything one example of the machine owns; ``close`` leaves nothing behind."""

    def __init__(self, continuations: dict[str, Any] | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="afterword-machine-", dir=_scratch_parent()))
        self.port = free_port()
        self.continuations = continuations or {}
        self.now_ms = START_MS
        self.switch = KillSwitch(DEFAULT_WAL.max_payload, MAX_RECORD_BYTES)
        self.tasks: list[Task] = []
        self.runs: list[Run] = []
        self.by_id: dict[str, Task] = {}
        self.channel = ScriptedChannel(
            self.switch, lambda cid: self.by_id[cid].epoch if cid in self.by_id else 0, self.allowed
        )
        self.synth = ScriptedSynth(self.switch)
        self.history = ScriptedHistory(self.switch)
        self.stats = Stats()
        self.switch.listener = self.committed
        self.problems: list[str] = []  # internal errors seen on public surfaces
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal("asyncio")
        self.portal = self._portal_cm.__enter__()
        # One connection per request: a kept-alive one may be closed by the server (idle timeout,
        # restart) just as the next request goes out, which is noise rather than a finding.
        self.http = httpx.Client(
            trust_env=False, timeout=30, limits=httpx.Limits(max_keepalive_connections=0)
        )
        self._service_cm: AbstractContextManager[ContinuationService] | None = None
        self.service: ContinuationService
        self.write_config()
        self.open()

    # -- lifecycle ---------------------------------------------------------------------------
    def clock(self) -> int:
        return self.now_ms

    def write_config(self) -> None:
        block = {"port": self.port, **self.continuations}
        self.config = afterword.load_config(write_config(self.root, continuations=block), environ=ENV)

    def allowed(self, conversation_id: str) -> bool:
        found = self.config.channel_for(conversation_id)
        return found is None or channel_allows(found[1], conversation_id)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T | None:
        """Call into the service; a failure is the process dying (the switch tripped) or a bug."""
        try:
            return self.portal.call(fn, *args)
        except Exception as exc:
            if self.switch.dead:
                return None
            raise Violation(f"I0: {getattr(fn, '__name__', fn)} failed: {exc!r}") from exc

    def open(self) -> None:
        """Open the state directory (I2: this must always succeed)."""
        for _attempt in range(10):
            cm = self.portal.wrap_async_context_manager(
                afterword.open_service(
                    self.config,
                    synthesizer=self.synth,
                    history=self.history,
                    channels={"slack": self.channel},
                    serve_http=True,
                    run_worker=False,
                    clock_ms=self.clock,
                    environ=ENV,
                    store_options=StoreOptions(observe_transaction=self.switch.observe),
                )
            )
            try:
                self.service = cm.__enter__()
            except Exception as exc:
                if not self.switch.dead:
                    raise Violation(f"I2: the state directory failed to open: {exc!r}") from exc
                self.switch.revive()  # the crash hit recovery itself: open again
                self.stats.opens_after_crash_in_recovery += 1
                continue
            self._service_cm = cm
            self.switch.countdown = None  # a cut meant for the reopening that did not come
            self.history.inner = DurableHistory(self.service.store)
            return
        raise Violation("I2: the state directory kept failing to open")

    def shut(self) -> None:
        """Stop the service; every host binding dies with the process."""
        cm, self._service_cm = self._service_cm, None
        for run in self.runs:
            run.binding = None
            if run.phase not in ("activated", "abandoned"):
                run.phase = "dead"
        if cm is not None:
            cm.__exit__(None, None, None)

    def restart(self, *, crash: bool, cut_recovery: int | None = None) -> None:
        """Stop (cleanly, or as a crash: nothing after the cut is durable) and reopen. Every
        host binding dies with the process."""
        if crash:
            self.switch.trip()
            self.stats.crashes += 1
        self.shut()
        self.switch.revive()
        self.switch.countdown = cut_recovery
        self.stats.restarts += 1
        self.open()

    def after_step(self) -> None:
        if self.switch.dead:
            self.restart(crash=True)

    def close(self) -> None:
        try:
            self.shut()
        finally:
            self.http.close()
            # Cancel whatever a failed step left running in the portal, then join its thread.
            self.portal.call(self.portal.stop, True)
            self._portal_cm.__exit__(None, None, None)
            shutil.rmtree(self.root, ignore_errors=True)
            self.stats.transactions = self.switch.transactions
            self.stats.largest_transaction = self.switch.largest_payload
            self.stats.posts = len(self.channel.posts)

    @property
    def worker(self) -> Worker:
        worker: Worker = self.service.worker  # type: ignore[attr-defined]
        return worker

    def committed(self, info: TransactionInfo) -> None:
        """Follow every continuation version and tombstone the service writes."""
        for op in info.ops:
            if op.value is None or op.key[:2] not in ("c/", "t/"):
                continue
            task = self.by_id.get(op.key[2:])
            if task is not None and op.key.startswith("c/"):
                state = decode_continuation(op.value).state
                if not task.states or task.states[-1] != state:
                    task.states.append(state)

    # -- public surfaces ---------------------------------------------------------------------
    def request(self, method: str, url: str, token: str, **kw: Any) -> httpx.Response:
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            **kw.pop("headers", {}),
        }
        response = self.http.request(method, url, headers=headers, **kw)
        if response.status_code >= 500 and not self.switch.dead:
            self.problems.append(
                f"{method} {url.rsplit('/', 2)[-2:]} -> {response.status_code} {response.text}"
            )
        return response

    def operator(self, verb: str, cid: str, body: dict[str, Any] | None = None) -> httpx.Response:
        self.stats.operator_calls += 1
        url = f"{self.config.base_url}/v1/operator/continuations/{cid}/{verb}"
        return self.request("POST", url, self.service.operator_token(), content=json.dumps(body or {}))

    def detached_headers(self) -> dict[str, str]:
        return {"X-Mono-Agent-Service-Name": SERVER, "Authorization": f"Bearer {DETACHED_TOKEN}"}

    def record(self, cid: str) -> Continuation | Tombstone | None:
        return self.service.repo.get(cid) or self.service.repo.tombstone(cid)

    def order(self) -> list[str]:
        """Live ids in the order the model learnt them (reproducible, unlike the ids)."""
        known = [t.cid for t in self.tasks if self.service.repo.get(t.cid) is not None]
        rest = sorted(r.id for r in self.service.repo.live() if r.id not in self.by_id)
        return known + rest

    def run_worker(self, ids: list[str] | None = None) -> list[str]:
        return self.call(self.worker.run_due, self.order() if ids is None else ids) or []

    def race(self, task: Task, verb: str, body: dict[str, Any], outcome: str) -> None:
        """Run ``task``'s delivery with its first post held in flight, send the operator
        ``verb`` meanwhile, then let the post end as ``outcome``: the channel's answer
        (``accept``, ``refuse``, ``transient``, ``unconfirmed``), or ``crash`` (the process dies
        after the verb, with the post answered 200), or ``crash_at_verb`` (the next commit, the
        verb's own if it makes one, kills the process). Checks I6: a post the channel confirmed
        to a live process is recorded on the record, whatever the verb did."""
        channel = self.channel
        channel.arrived.clear()
        channel.hold_next = "accept" if outcome.startswith("crash") else outcome
        future = self.portal.start_task_soon(self.worker.run_due, [task.cid])
        while not channel.arrived.wait(0.005):
            if future.done():  # it posted nothing (capture, silent, a revoked route, a failure)
                channel.hold_next = None
                self._join(future)
                return
        held = self.service.repo.get(task.cid)
        in_flight = held is not None and held.delivery_in_flight
        self.stats.races += 1
        if outcome == "crash_at_verb":
            self.switch.countdown = 1
        response = self.operator(verb, task.cid, body)
        if outcome == "crash":
            self.switch.trip()  # the step's after_step reopens it as a crash
        self.portal.call(channel.release)
        self._join(future)
        if response.status_code == 409 and in_flight:
            self.stats.race_refusals += 1
            if "in flight" not in response.json()["error"]["message"]:
                raise Violation(
                    f"I6: {verb} refused during a post in flight without saying why: {response.text}"
                )
        if response.status_code == 200 and verb == "retry" and body.get("allowUnknown"):
            task.epoch += 1
            self.stats.unsafe_retries += 1
        receipt = channel.held_receipt
        if receipt is None or self.switch.dead:
            return  # nothing confirmed, or the process died: recovery and I1 judge it
        rec = self.record(task.cid)
        kept = rec is not None and (
            (rec.receipt is not None and receipt in rec.receipt.delivery_ids)
            or (isinstance(rec, Continuation) and receipt in rec.chunk_receipts)
        )
        if not kept:
            state = rec.state if rec is not None else "removed"
            raise Violation(
                f"I6: the channel confirmed {receipt} for {task.cid} during {verb} "
                f"(answered {response.status_code}), but the record ({state}) does not hold it"
            )

    def _join(self, future: Any) -> None:
        try:
            future.result(timeout=60)
        except Exception as exc:
            if not self.switch.dead:
                raise Violation(f"I0: the worker failed during a race: {exc!r}") from exc

    def quiesce(self) -> None:
        """Let the worker run everything it may, moving the clock to each scheduled retry."""
        for _ in range(400):
            if self.switch.dead:
                self.restart(crash=True)
            if self.run_worker() or self.switch.dead:
                continue
            due = [
                r.next_attempt_at_ms
                for r in self.service.repo.live()
                if r.state == "delivery_retry" and r.next_attempt_at_ms is not None
            ]
            if not due:
                return
            self.now_ms = max(self.now_ms, min(due))
        raise Violation("I3: the worker never reached quiescence")

    # -- invariants --------------------------------------------------------------------------
    def check(self) -> None:
        """I0, I1, I4, I5 and the index check, after every step."""
        if self.problems:
            raise Violation(f"I0: an internal error on a public surface: {self.problems[0]}")
        dups = self.channel.duplicates()
        if dups:
            raise Violation(f"I1: chunks posted twice without the unsafe opt-in: {dups}")
        if self.channel.forbidden:
            raise Violation(f"posted to a destination the allow list revoked: {self.channel.forbidden}")
        if self.switch.oversized:
            raise Violation(f"I5: a transaction over the store's limits: {self.switch.oversized[0]}")
        self.check_index()
        self.check_health()

    def records(self) -> Iterator[Continuation | Tombstone]:
        yield from self.service.repo.live()
        yield from self.service.repo.tombstones()

    def check_index(self) -> None:
        """The repository's indexes equal a recount of its records (a diverged index would
        silently mislead health, admission and the worker)."""
        counts = Counter(r.state for r in self.records())
        indexed = +Counter(self.service.repo.state_counts)
        if counts != indexed:
            raise Violation(f"index: state counts {dict(indexed)} but the records say {dict(counts)}")

    def check_health(self) -> None:
        """I4: health is a function of the current records alone, and every record that needs
        an operator is named by a cause with the exact command that clears it."""
        body = self.service.continuation_health()
        records = list(self.records())
        expected = reference_health(records)
        if body.status != expected:
            raise Violation(f"I4: health is {body.status}, the records say {expected}")
        if (body.status == "healthy") != (not body.causes):
            raise Violation(f"I4: health {body.status} with causes {[c.code for c in body.causes]}")
        named: set[str] = set()
        for cause in body.causes:
            if len(cause.ids) != min(cause.count, 100) or len(cause.commands) != len(cause.ids):
                raise Violation(f"I4: cause {cause.code} counts {cause.count} but lists {len(cause.ids)}")
            for cid, command in zip(cause.ids, cause.commands, strict=True):
                verb = command.split()[2] if command.startswith("afterword continuations ") else ""
                if cid not in command or verb not in ("resolve", "acknowledge", "retry", "cancel"):
                    raise Violation(f"I4: cause {cause.code} of {cid} has no clearing command: {command!r}")
            named.update(cause.ids)
        needing = {r.claim.id for r in records if needs_attention(r)}
        if sum(c.count for c in body.causes) != len(needing) or not named <= needing:
            raise Violation(
                f"I4: causes count {sum(c.count for c in body.causes)}, the records {len(needing)}"
            )
        truncated = any(c.count > len(c.ids) for c in body.causes)
        if not truncated and needing - named:
            raise Violation(
                f"I4: records needing an operator are named by no cause: {sorted(needing - named)}"
            )

    def health_signals(self) -> tuple[str, frozenset[tuple[str, str]]]:
        body = self.service.continuation_health()
        return body.status, frozenset((c.code, cid) for c in body.causes for cid in c.ids)

    def check_settled(self, *, count: bool = False) -> None:
        """I3, after quiescence: every accepted result has ended, or waits on a cause an
        operator can see (a live host that has not settled its origin is not stuck)."""
        health = self.service.continuation_health()
        for task in self.tasks:
            if not task.acked or (task.run is not None and task.run.host_alive):
                continue
            rec = self.record(task.cid)
            if rec is None:  # retention removed it: judge the last state it was written in
                if not task.states or task.states[-1] not in RESULT_ENDS:
                    raise Violation(f"I3: {task.cid} was removed in state {task.states[-1:]}")
                continue
            if rec.state in RESULT_ENDS:
                if count:
                    why = rec.receipt.kind if rec.receipt else (rec.last_error.code if rec.last_error else "")
                    self.stats.ends[f"{rec.state}:{why}"] += 1
                continue
            waiting = (
                isinstance(rec, Continuation)
                and rec.state == "delivery_retry"
                and rec.next_attempt_at_ms is None
                and health.status != "healthy"
            )
            if not waiting:
                detail = (
                    f"deferred={rec.deferred} origin={rec.origin_context}"
                    if isinstance(rec, Continuation)
                    else ""
                )
                raise Violation(f"I3: {task.cid} ({task.mode}) is stuck in {rec.state} {detail}")


def needs_attention(rec: Continuation | Tombstone) -> bool:
    """Whether an operator must act on a record, written from the spec, not from the service's
    code: an unknown delivery until resolved; a dead letter, an expiry or a delivered answer
    missing from history until acknowledged; work in progress, or held for a retry."""
    if rec.state == "delivery_unknown" or rec.state in ACTIVE:
        return True
    if rec.acknowledged_at_ms is not None:
        return False
    missing = rec.state == "delivered" and rec.receipt is not None and not rec.receipt.history_recorded
    return rec.state in ("dead_lettered", "expired") or missing


def reference_health(records: list[Continuation | Tombstone]) -> str:
    """Health from the records alone (I4)."""
    attention = [r for r in records if needs_attention(r)]
    if any(r.state in ("delivery_unknown", "dead_lettered") for r in attention):
        return "unhealthy"
    return "degraded" if attention else "healthy"

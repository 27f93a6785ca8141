"""The continuation lifecycle as a crash-simulator workload (``lifecycle``).

The real :class:`~afterword.app.service.ContinuationService` runs on the recorded disk with its
real worker, driven step by step (no background loop, no HTTP): an interactive claim through a
run binding, the origin snapshot, activation, the result, then synthesis and delivery through
``Worker.synthesize``; beside it a detached claim on a notify route and one on a silent route.
The synthesizer and the channel are in-process fakes; the channel's posts are kept in memory,
outside the state directory, because a post is an effect no crash can undo.

Every durable step is one numbered operation, acknowledged where the system makes it durable:
an API call when it returns, a worker transition when its commit is announced
(``service.on_change``), the history append when it returns. ``expect`` is an independent
model of the lifecycle plus the restart rules (a pending origin is abandoned, an interrupted
synthesis is dead-lettered, a delivery that may have posted is ``delivery_unknown``), so a
recovered state is checked against the acknowledged prefix, not against the code under test.

Durable facts (``Journal.fact``) carry the at-most-once promises, declared the moment the
outside world saw something: once the synthesizer was called, recovery must never make the
result synthesizable again; once the channel posted, recovery must never make the answer
postable again (only ``delivered`` or ``delivery_unknown``). The probe then plays the outside
world after the restart (the producer repeats its result, the worker runs everything it may)
and checks that nothing already synthesized or posted is synthesized or posted again, and that
every continuation ends terminal.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import msgspec

from afterword.app.binding import RunBinding
from afterword.app.service import ContinuationService
from afterword.blobs import BlobError, BlobStore
from afterword.config import Config, DetachedService, NamedRoute
from afterword.continuations.capabilities import continuation_id, result_token
from afterword.continuations.model import Continuation, Tombstone, canonical_claim
from afterword.continuations.rules import format_ms
from afterword.disk import Disk, DiskFailedError, OsDisk, StateRoot
from afterword.history import DurableHistory, Message
from afterword.legacy import open_state
from afterword.protocol.wire import ClaimRequest, ClaimResponse, DetachedClaimRequest, ResultRequest
from afterword.store import RecordStore, StoreClosedError, StoreOptions
from afterword.store.keys import CONTINUATION_IDS, RESULT_TOKENS, derive_key
from afterword.worker import ChunkDelivery, ChunkReceipt, SynthesisRequest, Worker
from afterword.worker.channels import OutboxChannel, split_chunks
from afterword.worker.compose import attach_worker

from .store_workloads import _secret_fingerprint, repeatable_commits, small_options
from .workloads import Journal, Observation, Workload, WorkloadError, register

# The worker logs interrupted and failed steps at WARNING; without a handler Python would print
# each one to stderr, thousands of times per run. A NullHandler keeps that quiet and still lets
# an application that configures logging see them.
logging.getLogger("afterword").addHandler(logging.NullHandler())

# -- the fixed world ------------------------------------------------------------------------------
CLOCK_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z; a fixed clock keeps every run identical
DEADLINE = format_ms(CLOCK_MS + 24 * 3600 * 1000)
SERVER = "work-control"
TOKEN_ENV = "AFTERWORD_CRASHSIM_DETACHED_TOKEN"
ENVIRON = {TOKEN_ENV: "crashsim-detached-bearer-for-tests-only"}  # not a secret: a fixed test value
CHUNK_CHARS = 80  # the fake channel's limit: the interactive answer takes two posts

# Small unfilled segments keep the log short (store_workloads.small_options). The
# largest transaction (a continuation with its answer) is well under 4 KiB; 16 KiB puts the second
# segment's creation under a chunk post, so a refused write mid-post is among the fault plans
# (seed 1, 'truncate#2:ENOSPC:once'; the worker then leaves the record in flight for recovery).
OPTIONS = small_options(16 * 1024, 4096, 1 << 20)  # the shipped defaults, commit mode included


@dataclass(frozen=True)
class Party:
    """One continuation of the scenario, by a short label."""

    label: str
    kind: str  # "interactive" | "detached"
    task_key: str
    route: str | None  # named route (detached)
    conversation: str | None  # where its answer goes and whose history it joins


INTERACTIVE = Party("I", "interactive", "index-repo", None, "chat:C1:T1")  # reply mode
NOTIFY = Party("N", "detached", "nightly-scan", "daily-attention", "chat:C_DAILY:T1")  # notify_if_actionable
SILENT = Party("S", "detached", "reindex", "background-index", None)  # silent
PARTIES = (INTERACTIVE, NOTIFY, SILENT)
BY_LABEL = {p.label: p for p in PARTIES}
ORIGIN_HISTORY = (
    {"role": "user", "content": "Please index the repository and tell me when it is done."},
    {"role": "assistant", "content": "Started the indexer; I will report back here."},
)


def make_config(state_dir: str) -> Config:
    """The configuration ``open_service`` would load, built directly (no files outside the
    state directory; ``channels`` is empty because the worker gets the fake channel)."""
    return Config(
        config_dir=os.path.dirname(os.path.abspath(state_dir)),
        enabled=True,
        state_dir=state_dir,
        named_routes={
            "daily-attention": NamedRoute(mode="notify_if_actionable", conversation_id=NOTIFY.conversation),
            "background-index": NamedRoute(mode="silent"),
        },
        detached_services={SERVER: DetachedService(name=SERVER, token_env=TOKEN_ENV)},
        continuation_servers=(SERVER,),
        channels={},
    )


def fixed_clock() -> int:
    return CLOCK_MS


def payload_of(party: Party, seed: int) -> dict[str, Any]:
    if party is INTERACTIVE:
        words = " ".join(f"part{i}" for i in range(12))
        return {"summary": f"indexed 4{seed % 10} files: {words}", "files": 40 + seed % 10}
    return {"summary": f"{party.task_key} finished (seed {seed})", "actionable": True}


def result_request(party: Party, seed: int) -> ResultRequest:
    payload = payload_of(party, seed)
    digest = hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()
    return ResultRequest(idempotency_key=f"result-{party.label}", payload_hash=digest, payload=payload)


def body_length(req: ResultRequest) -> int:
    return len(msgspec.json.encode(req))


def answer_text(payload: Any) -> str:
    """The fake synthesizer's answer: a function of the payload only, so runs repeat exactly."""
    summary = payload.get("summary", "") if isinstance(payload, dict) else ""
    return f"Done: {summary}"


# -- the operations and the model of what they leave durable ----------------------------------------
@dataclass(frozen=True)
class Op:
    number: int
    label: str
    kind: str  # claim finalize activate result synth-start text in-flight chunk history delivered silent


CHAIN_KINDS = ("synth-start", "text", "in-flight", "chunk", "history", "delivered", "silent")


@dataclass(frozen=True)
class View:
    """What recovery exposes of one continuation (ids and times left out: they are checked
    through facts, and the clock is fixed)."""

    state: str
    origin: str
    snapshot: bool = False
    result: bool = False
    text: bool = False
    completion: str | None = None
    attempts: tuple[int, int] = (0, 0)  # synthesis, delivery
    in_flight: bool = False
    chunks: int = 0
    error: str | None = None
    receipt: str | None = None
    history_recorded: bool | None = None

    def __repr__(self) -> str:
        """Short and state first: the checkers' diffs show only the first 40 characters."""
        parts = [self.state + (" IN-FLIGHT" if self.in_flight else "")]
        parts += [f"chunks={self.chunks}"] if self.chunks else []
        parts += [f"error={self.error}"] if self.error else []
        parts.append(f"a{self.attempts[0]}/{self.attempts[1]} {self.origin}")
        flags = [
            n for n, on in (("snapshot", self.snapshot), ("result", self.result), ("text", self.text)) if on
        ]
        parts += ["+" + "+".join(flags)] if flags else []
        parts += [f"completion={self.completion}"] if self.completion else []
        parts += [f"receipt={self.receipt} history={self.history_recorded}"] if self.receipt else []
        return " ".join(parts)


def view_of(rec: Continuation) -> View:
    receipt = rec.receipt
    return View(
        state=rec.state,
        origin=rec.origin_context,
        snapshot=rec.snapshot_digest is not None,
        result=rec.result is not None,
        text=rec.text is not None,
        completion=rec.completion_kind,
        attempts=(rec.attempts.synthesis, rec.attempts.delivery),
        in_flight=rec.delivery_in_flight,
        chunks=len(rec.chunk_receipts),
        error=rec.last_error.code if rec.last_error is not None else None,
        receipt=receipt.kind if receipt is not None else None,
        history_recorded=receipt.history_recorded if receipt is not None else None,
    )


@dataclass(frozen=True)
class Compacted:
    """What is left of a settled continuation once retention compacted it (a tombstone)."""

    state: str
    result: bool
    completion: str | None
    error: str | None
    receipt: str | None
    history_recorded: bool | None


def compacted_of(tomb: Tombstone) -> Compacted:
    receipt = tomb.receipt
    return Compacted(
        state=tomb.state,
        result=tomb.idempotency_key is not None,
        completion=tomb.completion_kind,
        error=tomb.last_error.code if tomb.last_error is not None else None,
        receipt=receipt.kind if receipt is not None else None,
        history_recorded=receipt.history_recorded if receipt is not None else None,
    )


@dataclass
class Model:
    """The durable state the operations leave, before any restart rule applies. ``local``: the
    synthesizer is local, so its answer and attempt are one operation from result_received."""

    views: dict[str, View] = field(default_factory=dict)
    local: bool = False
    lines: dict[str, int] = field(default_factory=dict)  # outbox lines made durable, by label
    activation: bool = False
    answered: set[str] = field(default_factory=set)  # labels whose answer is in the history

    def apply(self, op: Op) -> None:
        """Apply ``op`` as the service would; an op whose precondition fails changes nothing
        (the real call is refused the same way, e.g. a result for a claim that never landed)."""
        label, kind = op.label, op.kind
        v = self.views.get(label)
        if kind == "claim":
            if v is None:
                origin = "pending" if BY_LABEL[label].kind == "interactive" else "detached_latest"
                self.views[label] = View(state="claimed", origin=origin)
            return
        if v is None:
            return
        s, d = v.attempts
        delivering = v.state in ("ready_to_deliver", "delivery_retry")
        new: View | None = None
        if kind == "finalize" and v.origin == "pending":
            new = replace(v, snapshot=True)
        elif kind == "activate" and v.origin == "pending":
            new = replace(v, origin="pinned" if v.snapshot else "abandoned")
            self.activation = True
        elif kind == "result" and v.state == "claimed":
            new = replace(v, state="result_received", result=True)
        elif (
            kind == "synth-start"
            and v.state == "result_received"
            and v.origin in ("pinned", "detached_latest")
        ):
            new = replace(v, state="synthesizing", attempts=(s + 1, d))
        elif kind == "text" and v.state == "synthesizing":
            new = replace(v, state="ready_to_deliver", text=True, completion="synthesized")
        elif (
            kind == "text"
            and self.local
            and v.state == "result_received"
            and v.origin in ("pinned", "detached_latest")
        ):
            new = replace(
                v, state="ready_to_deliver", text=True, completion="synthesized", attempts=(s + 1, d)
            )
        elif kind == "text" and v.state == "result_received" and v.origin == "abandoned":
            # No origin context (only when injected faults kept the snapshot from binding): the
            # fixed answer, without a model call.
            new = replace(v, state="ready_to_deliver", text=True, completion="origin_context_unavailable")
        elif kind == "in-flight" and delivering and not v.in_flight:
            new = replace(v, in_flight=True, attempts=(s, d + 1))
        elif kind == "chunk" and delivering:
            new = replace(v, chunks=v.chunks + 1)
        elif kind == "post":  # an outbox line was made durable (the outbox workload)
            self.lines[label] = self.lines.get(label, 0) + 1
        elif kind == "history":
            self.answered.add(label)
        elif kind == "delivered" and delivering:
            new = replace(
                v,
                state="delivered",
                in_flight=False,
                error=None,
                receipt="posted",
                history_recorded=label in self.answered,
            )
        elif kind == "silent" and v.state == "result_received":
            new = replace(v, state="delivered", completion="silent", receipt="silent", history_recorded=True)
        if new is not None:
            self.views[label] = new


SETTLED = frozenset({"delivered", "expired", "cancelled"})


def after_restart(v: View, outbox: tuple[int, int] | None = None) -> View | Compacted:
    """The restart rules, written from the lifecycle's invariants (not from its code), then the
    retention pass ``open_service`` runs: settled outcomes are compacted at once. ``outbox``:
    the channel can reconcile, holding that many of the answer's chunks (lines, chunks)."""
    if v.origin == "pending":
        v = replace(v, origin="abandoned")  # the origin run never committed
    interrupted = v.state in ("ready_to_deliver", "delivery_retry") and (v.in_flight or v.chunks)
    if outbox is not None and interrupted:
        held, total = outbox
        if held >= total:  # every chunk is in the outbox: delivered, and the answer recorded
            v = replace(
                v,
                state="delivered",
                in_flight=False,
                chunks=0,
                error=None,
                receipt="posted",
                history_recorded=True,
            )
        else:  # the rest is posted at once; nothing is unproven
            v = replace(v, state="delivery_retry", in_flight=False, chunks=0, error="delivery_reconciled")
    if v.state == "synthesizing":
        v = replace(v, state="dead_lettered", error="synthesis_interrupted", in_flight=False)
    elif v.state in ("ready_to_deliver", "delivery_retry") and (v.in_flight or v.chunks):
        v = replace(v, state="delivery_unknown", error="delivery_interrupted", in_flight=False)
    if v.state in SETTLED:
        return Compacted(v.state, v.result, v.completion, v.error, v.receipt, v.history_recorded)
    return v


# Where a continuation may be after a restart once it durably reached a state (the facts
# ``<label>.reached.<state>``): never back, and never in the states recovery must resolve.
_ONWARD = frozenset({"ready_to_deliver", "delivery_retry", "delivered", "delivery_unknown", "dead_lettered"})
REACHABLE: dict[str, frozenset[str]] = {
    "claimed": _ONWARD | {"claimed", "result_received", "expired", "cancelled"},
    "result_received": _ONWARD | {"result_received", "cancelled"},
    "synthesizing": _ONWARD | {"cancelled"},
    "ready_to_deliver": _ONWARD | {"cancelled"},
    "delivered": frozenset({"delivered"}),
}
REACHED_BY = {"claim": "claimed", "result": "result_received", "synth-start": "synthesizing"}
REACHED_BY |= {"text": "ready_to_deliver", "delivered": "delivered", "silent": "delivered"}
NOT_REPOSTABLE = frozenset({"delivered", "delivery_unknown"})


# -- in-process effects ------------------------------------------------------------------------------
class FakeSynthesizer:
    """Deterministic and instant; ``on_call`` runs at the moment the model would be asked.
    ``local`` makes it declare itself local, as the template synthesizer does."""

    def __init__(self, on_call: Callable[[str], None] = lambda _cid: None, *, local: bool = False) -> None:
        if local:
            self.local = True
        self.on_call = on_call
        self.calls: list[str] = []

    async def synthesize(self, request: SynthesisRequest) -> str:
        self.calls.append(request.continuation_id)
        self.on_call(request.continuation_id)
        return answer_text(request.payload)


class RecordingChannel:
    """Confirms every post and remembers it, in memory (outside the state directory)."""

    max_chunk_chars = CHUNK_CHARS

    def __init__(self, on_post: Callable[[ChunkDelivery], None] = lambda _d: None) -> None:
        self.on_post = on_post
        self.posts: list[ChunkDelivery] = []

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        self.posts.append(delivery)
        self.on_post(delivery)
        return ChunkReceipt(delivery_id=f"msg-{delivery.delivery_key}", channel_id="crashsim")


class RecordingOutbox(OutboxChannel):
    """The real outbox (on the recorded disk, beside the state directory) with the fake
    channel's chunk size, telling the workload when a post begins and when its line is durable."""

    max_chunk_chars = CHUNK_CHARS

    def __init__(
        self,
        path: str,
        disk: Disk | None,
        on_post: Callable[[ChunkDelivery], None] = lambda _d: None,
        on_durable: Callable[[ChunkDelivery], None] = lambda _d: None,
    ) -> None:
        super().__init__(path, disk=disk)
        self.on_post = on_post
        self.on_durable = on_durable
        self.posts: list[ChunkDelivery] = []

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        self.posts.append(delivery)
        self.on_post(delivery)
        receipt = await super().post(delivery)
        self.on_durable(delivery)
        return receipt


def _unfaulted(disk: Disk, journal: Journal) -> Disk:
    """The disk for the outbox: the recorded one while crash states are explored, a plain one
    (neither faulted nor counted) while faults are injected or counted."""
    if journal.tolerant or type(disk).__name__ == "FaultyDisk":
        return OsDisk()
    return disk


def outbox_path(state_dir: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(state_dir)), "outbox.jsonl")


def outbox_keys(state_dir: str) -> list[str]:
    """The delivery keys of the outbox's complete lines, in file order (duplicates kept)."""
    try:
        with open(outbox_path(state_dir), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    keys = []
    for raw in data[: data.rfind(b"\n") + 1].split(b"\n"):
        try:
            keys.append(msgspec.json.decode(raw)["deliveryKey"])
        except (msgspec.DecodeError, KeyError, TypeError):
            continue
    return keys


class ObservedHistory:
    """``DurableHistory`` with a hook after each durable append (the worker's history step)."""

    def __init__(self, inner: DurableHistory, on_append: Callable[[str], None]) -> None:
        self.inner = inner
        self.on_append = on_append

    async def append(self, conversation_id: str, messages: Sequence[Message]) -> None:
        await self.inner.append(conversation_id, messages)
        self.on_append(conversation_id)

    async def latest(self, conversation_id: str, limit: int) -> list[Message]:
        return await self.inner.latest(conversation_id, limit)

    def has_message(self, conversation_id: str, message_id: str) -> bool:
        return self.inner.has_message(conversation_id, message_id)


def ids_for(secret: bytes) -> dict[str, str]:
    """Continuation ids are derived from the store secret: recovery can name every party
    without the recording run (and a changed secret shows as changed ids)."""
    key = derive_key(secret, CONTINUATION_IDS)
    return {p.label: continuation_id(key, p.kind, SERVER, p.task_key) for p in PARTIES}


@dataclass
class Opened:
    store: RecordStore
    service: ContinuationService
    worker: Worker
    history: DurableHistory
    ids: dict[str, str]


async def open_like_open_service(
    state_dir: str,
    disk: Disk | None,
    *,
    synthesizer: Any,
    channel: Any,
    options: StoreOptions,
    on_history: Callable[[str], None] = lambda _c: None,
) -> Opened:
    """What ``open_service`` does before serving: open, fence/migrate, recover, retention."""
    store = RecordStore.open(state_dir, disk=disk, options=options)
    try:
        config = make_config(state_dir)
        open_state(store, config)
        blobs = BlobStore(store.root, store.secret)
        service = ContinuationService(config, store, blobs, clock_ms=fixed_clock, environ=ENVIRON)
        history = DurableHistory(store)
        worker = attach_worker(
            service,
            synthesizer=synthesizer,
            channels={"*": channel},
            history=ObservedHistory(history, on_history),
        )
        await worker.reconcile_interrupted()  # a no-op here: the fake channel cannot reconcile
        await service.recover()
        await service.apply_retention()
    except BaseException:
        store.close()
        raise
    return Opened(store, service, worker, history, ids_for(store.secret))


@dataclass(frozen=True)
class Verdict:
    """Everything one recovery tells the checkers (kept for ``facts``/``state_problems``)."""

    observation: dict[str, Any]
    facts: dict[str, str]
    problems: tuple[str, ...]


async def inspect(opened: Opened) -> Verdict:
    service, ids = opened.service, opened.ids
    label_of = {cid: label for label, cid in ids.items()}
    obs: dict[str, Any] = {}
    facts: dict[str, str] = {}
    problems: list[str] = []
    for rec in service.repo.live():
        label = label_of.get(rec.id, f"unknown:{rec.id}")
        obs[label] = view_of(rec)
    for tomb in service.repo.tombstones():
        obs[label_of.get(tomb.claim.id, f"unknown:{tomb.claim.id}")] = compacted_of(tomb)
    obs["activation"] = service.repo.activation(f"run-{INTERACTIVE.task_key}") is not None
    for party in PARTIES:
        if party.conversation is not None:
            latest = await opened.history.latest(party.conversation, 100)
            names = []
            for m in latest:
                cid, _, rest = m.id.partition(":")
                names.append(f"{label_of.get(cid, cid)}:{rest}")
            obs[f"history:{party.label}"] = tuple(names)
        live = service.repo.get(ids[party.label])
        facts.update(_facts_of(party.label, live or service.repo.tombstone(ids[party.label])))
        if live is not None:
            problems += _blob_problems(service, live)
    referenced = opened.store.referenced_blobs()
    for digest in sorted(service.blobs.digests() - referenced):
        problems.append(f"blob {digest[:12]} is referenced by no record but survived recovery's sweep")
    return Verdict(obs, facts, tuple(problems))


def _facts_of(label: str, rec: Continuation | Tombstone | None) -> dict[str, str]:
    """The durable facts a recovered continuation (live or compacted) shows."""
    if rec is None:
        return {f"{label}.id": "absent"}
    facts = {f"{label}.id": rec.claim.id}
    if isinstance(rec, Tombstone):
        key, digest, synthesized = rec.idempotency_key, rec.payload_hash, 0
    else:
        key = rec.result.idempotency_key if rec.result else None
        digest = rec.result.payload_hash if rec.result else None
        synthesized = rec.attempts.synthesis
    facts[f"{label}.result"] = f"{key}/{(digest or '')[:16]}" if key else "none"
    for milestone, allowed in REACHABLE.items():
        facts[f"{label}.reached.{milestone}"] = (
            "yes" if rec.state in allowed else f"no, recovered {rec.state}"
        )
    repeatable = rec.state in ("result_received", "synthesizing") or synthesized > 1
    facts[f"{label}.synthesis"] = f"again from {rec.state}" if repeatable else "never again"
    facts[f"{label}.posted"] = (
        "never again" if rec.state in NOT_REPOSTABLE else f"postable again from {rec.state}"
    )
    return facts


def _blob_problems(service: ContinuationService, rec: Continuation) -> list[str]:
    if rec.snapshot_digest is None:
        return []
    digest, mac = rec.snapshot_digest, rec.snapshot_mac or ""
    try:
        service.blobs.get(digest)
        service.blobs.verify_binding(digest, canonical_claim(rec.claim), mac)
    except (BlobError, ValueError) as exc:
        return [f"snapshot blob {digest[:12]} of {rec.id}: {type(exc).__name__}: {exc}"]
    return []


# -- the workload ------------------------------------------------------------------------------------
@register
class ContinuationLifecycle(Workload):
    """Claims, results, synthesis and delivery of three continuations through the real service.

    The seed picks the payloads and the interleaving: whether the interactive result arrives
    before its origin run activates (a deferred result), and which continuation's worker step
    runs first. ``ops`` below the full count runs the longest prefix of whole steps (a worker
    step is several operations and cannot be cut).
    """

    name = "lifecycle"
    summary = "continuation lifecycle: interactive + detached claims, results, synthesis, delivery"
    default_ops = 20
    local = False  # a remote (model) synthesizer: synthesizing is durable before the call
    outbox = False  # the channel is a recording stand-in that cannot reconcile

    def __init__(self, *, seed: int, ops: int | None = None) -> None:
        super().__init__(seed=seed, ops=ops)
        self.options = OPTIONS
        self.rng = random.Random(f"{self.name}/{seed}")
        self.chunk_counts = {
            p.label: len(split_chunks(answer_text(payload_of(p, seed)), CHUNK_CHARS)) for p in PARTIES
        }
        self.steps = self.script()
        total = sum(len(s) for s in self.steps)
        if self.ops > total:
            raise ValueError(f"{self.name} has {total} operations, not {self.ops}")
        kept: list[tuple[Op, ...]] = []
        for step in self.steps:
            if step[-1].number > self.ops:
                break
            kept.append(step)
        self.steps = kept
        self.ops = sum(len(s) for s in kept)  # the first step is one op, so never 0
        self.ops_by_number = {op.number: op for step in self.steps for op in step}
        self._verdict: tuple[str, Verdict] | None = None

    def script(self) -> list[tuple[Op, ...]]:
        """Steps (tuples of numbered operations; a worker step holds several)."""
        plan: list[tuple[tuple[str, str], ...]] = [(("I", "claim"),), (("N", "claim"),), (("I", "finalize"),)]
        early = self.rng.random() < 0.5  # the producer answers before the origin run commits
        if early:
            plan += [(("I", "result"),), (("I", "activate"),)]
        else:
            plan += [(("I", "activate"),), (("I", "result"),)]
        plan += [(("S", "claim"),), (("N", "result"),), (("S", "result"),)]
        start = () if self.local else ("synth-start",)
        # With the outbox every post is an operation too: its line is durable when it returns.
        post = ("post",) if self.outbox else ()
        interactive = tuple(
            ("I", k) for k in (*start, "text", "in-flight", *post, "chunk", *post, "history", "delivered")
        )
        notify = tuple(("N", k) for k in (*start, "text", "in-flight", *post, "history", "delivered"))
        workers = [interactive, notify, (("S", "silent"),)]
        self.rng.shuffle(workers)
        plan += workers
        steps: list[tuple[Op, ...]] = []
        n = 0
        for step in plan:
            ops = []
            for label, kind in step:
                n += 1
                ops.append(Op(n, label, kind))
            steps.append(tuple(ops))
        return steps

    # -- Workload interface ----------------------------------------------------------------------
    def run(self, state_dir: str, disk: Disk, journal: Journal) -> None:
        session = _Session(self, state_dir, disk, journal)
        with repeatable_commits():
            anyio.run(session.main)
        lines = outbox_keys(state_dir) if self.outbox else []
        if len(lines) != len(set(lines)):
            raise WorkloadError(f"{self.name}: the outbox holds a delivery key twice: {sorted(lines)}")
        if session.duplicates and not self.outbox:  # the outbox may retry a post that wrote nothing
            raise WorkloadError(f"{self.name}: delivery keys posted twice: {session.duplicates}")

    def expect(self, committed: Sequence[int]) -> dict[str, Any]:
        model = Model(local=self.local)
        for number in committed:
            model.apply(self.ops_by_number[number])
        out: dict[str, Any] = {}
        answered = set(model.answered)
        for label, v in model.views.items():
            held = (model.lines.get(label, 0), self.chunk_counts[label]) if self.outbox else None
            out[label] = after_restart(v, held)
            if held is not None and v.state != "delivered" and _state(out[label]) == "delivered":
                answered.add(label)  # reconciled as delivered: recovery appends the answer
        out["activation"] = model.activation
        for party in PARTIES:
            if party.conversation is not None:
                out[f"history:{party.label}"] = (f"{party.label}:answer",) if party.label in answered else ()
        return out

    def recover(self, state_dir: str, disk: Disk) -> dict[str, Any]:
        verdict = anyio.run(self._recover, state_dir, disk)
        self._verdict = (os.path.realpath(state_dir), verdict)
        return verdict.observation

    async def _recover(self, state_dir: str, disk: Disk | None) -> Verdict:
        opened = await open_like_open_service(
            state_dir,
            disk,
            synthesizer=FakeSynthesizer(local=self.local),
            channel=self.channel_for(state_dir, disk),
            options=self.options,
        )
        try:
            return await inspect(opened)
        finally:
            opened.store.close()

    def _verdict_for(self, state_dir: str) -> Verdict:
        """The verdict of the recovery that just ran on ``state_dir`` (the runner asks for facts
        and state checks right after it); recovering again is idempotent, so a miss is fine."""
        if self._verdict is not None and self._verdict[0] == os.path.realpath(state_dir):
            return self._verdict[1]
        self.recover(state_dir, OsDisk())
        assert self._verdict is not None
        return self._verdict[1]

    def channel_for(self, state_dir: str, disk: Disk | None) -> RecordingChannel | RecordingOutbox:
        return RecordingOutbox(outbox_path(state_dir), disk) if self.outbox else RecordingChannel()

    def facts(self, state_dir: str) -> dict[str, str]:
        facts = dict(self._verdict_for(state_dir).facts)
        if self.outbox:  # which lines the outbox holds: once durable, a line stays
            held = set(outbox_keys(state_dir))
            ids = ids_for(StateRoot(state_dir, create=False).read_file("secret", max_size=32))
            for label, count in self.chunk_counts.items():
                for i in range(count):
                    facts[f"{label}.line{i}"] = "present" if f"{ids[label]}:{i}" in held else "absent"
        root = StateRoot(state_dir, create=False)
        facts["secret"] = _secret_fingerprint(root.read_file("secret", max_size=32))
        return facts

    def state_problems(self, state_dir: str, observation: Observation) -> list[str]:
        return list(self._verdict_for(state_dir).problems)

    def probe(self, state_dir: str, observation: Observation) -> list[str]:
        return anyio.run(self._probe, state_dir, observation)

    async def _probe(self, state_dir: str, observation: Observation) -> list[str]:
        """After the restart the outside world carries on: each producer repeats its result (it
        may never have seen the answer), the worker does everything it may. Nothing whose
        synthesis began or whose answer was posted may be synthesized or posted again, and
        every continuation must end terminal; a reopen must then change nothing."""
        synth, channel = FakeSynthesizer(local=self.local), self.channel_for(state_dir, None)
        problems: list[str] = []
        try:
            opened = await open_like_open_service(
                state_dir, None, synthesizer=synth, channel=channel, options=self.options
            )
        except Exception as exc:
            return [f"recovering a copy failed: {type(exc).__name__}: {exc}"]
        try:
            before = await inspect(opened)
            if before.observation != dict(observation):
                problems.append("recovering an identical copy exposed a different state")
            service, ids = opened.service, opened.ids
            label_of = {cid: label for label, cid in ids.items()}
            for party in PARTIES:
                cid = ids[party.label]
                if service.repo.get(cid) is None and service.repo.tombstone(cid) is None:
                    continue  # the claim never landed: its producer got no id to report to
                req = result_request(party, self.seed)
                token = result_token(derive_key(opened.store.secret, RESULT_TOKENS), cid)
                try:
                    await service.submit_result(cid, token, req, body_length(req))
                except Exception as exc:
                    problems.append(f"{party.label}: the producer's repeated result was refused: {exc}")
            for _round in range(4):
                acted = False
                for rec in service.repo.live():
                    action = opened.worker._action(rec, fixed_clock())
                    if action == "synthesize":
                        await opened.worker.synthesize(rec.id)
                    elif action == "deliver":
                        await opened.worker.deliver(rec.id)
                    acted = acted or action is not None
                if not acted:
                    break
            may_synthesize = {"claimed", "result_received"}
            may_post = may_synthesize | {"ready_to_deliver"}
            if self.outbox:  # a reconciled partial delivery posts the rest (the outbox skips the rest)
                may_post |= {"delivery_retry"}
            for cid in synth.calls:
                label = label_of.get(cid, cid)
                was = observation.get(label)
                if _state(was) not in may_synthesize:
                    problems.append(f"{label}: synthesized again after recovery exposed {_state(was)}")
            for post in channel.posts:
                label = label_of.get(post.delivery_key.partition(":")[0], post.delivery_key)
                was = observation.get(label)
                if _state(was) not in may_post:
                    problems.append(f"{label}: posted again after recovery exposed {_state(was)}")
            keys = [p.delivery_key for p in channel.posts]
            if len(keys) != len(set(keys)):
                problems.append(f"a delivery key was posted twice after recovery: {sorted(keys)}")
            lines = outbox_keys(state_dir) if self.outbox else []
            if len(lines) != len(set(lines)):
                problems.append(f"the outbox holds a delivery key twice: {sorted(lines)}")
            settled: dict[str, str] = {}
            for rec in service.repo.live():
                settled[label_of.get(rec.id, rec.id)] = rec.state
                if not rec.terminal:
                    problems.append(f"{label_of.get(rec.id, rec.id)} still {rec.state} after the worker ran")
        except Exception as exc:
            problems.append(f"carrying on after recovery failed: {type(exc).__name__}: {exc}")
            return problems
        finally:
            opened.store.close()
        try:
            again = await self._recover(state_dir, None)
        except Exception as exc:
            return [*problems, f"reopening after the worker ran failed: {type(exc).__name__}: {exc}"]
        for label, state in settled.items():
            if _state(again.observation.get(label)) != state:
                problems.append(
                    f"{label}: {state} changed to {_state(again.observation.get(label))} on reopening"
                )
        return problems


def _state(view: object) -> str:
    if isinstance(view, View | Compacted):
        return view.state
    return "absent" if view is None else repr(view)


# -- one recorded run --------------------------------------------------------------------------------
class _Session:
    """One execution of the script under the recorded disk, reporting to the journal."""

    def __init__(self, workload: ContinuationLifecycle, state_dir: str, disk: Disk, journal: Journal) -> None:
        self.w = workload
        self.state_dir = state_dir
        self.disk = disk
        self.journal = journal
        self.opened: Opened | None = None
        self.claims: dict[str, ClaimResponse] = {}
        self.binding: RunBinding | None = None
        self.synth = FakeSynthesizer(self._synthesizing, local=workload.local)
        self.channel: RecordingChannel | RecordingOutbox = (
            # Injected I/O errors are aimed at the store: the outbox's own error handling has
            # its tests (tests/unit/test_outbox_group_commit.py), so it writes past the faults.
            RecordingOutbox(outbox_path(state_dir), _unfaulted(disk, journal), self._posted, self._durable)
            if workload.outbox
            else RecordingChannel(self._posted)
        )
        self.duplicates: list[str] = []
        self.chain: list[Op] = []  # the worker step in progress: chain[0] is begun, not acked
        self.chain_label = ""
        self.begun_poisoned = False
        self.errors: list[str] = []

    def poisoned(self) -> bool:
        return self.opened is None or self.opened.store.root.failed is not None

    @property
    def label_of(self) -> dict[str, str]:
        assert self.opened is not None
        return {cid: label for label, cid in self.opened.ids.items()}

    async def main(self) -> None:
        try:
            self.opened = await open_like_open_service(
                self.state_dir,
                self.disk,
                synthesizer=self.synth,
                channel=self.channel,
                options=self.w.options,
                on_history=self._history,
            )
        except Exception as exc:
            if not self.journal.tolerant:
                raise
            self.journal.note(f"open failed: {type(exc).__name__}: {exc}")
            for step in self.w.steps:
                for op in step:
                    self.journal.fail(op.number, None, refused=True)
            return
        self.journal.note("opened")
        self.journal.fact("secret", _secret_fingerprint(self.opened.store.secret))
        self.opened.service.on_change.append(self._committed)
        try:
            for step in self.w.steps:
                if step[0].kind in CHAIN_KINDS:
                    await self.worker_step(step)
                else:
                    await self.api_step(step[0])
        finally:
            self.opened.store.close()

    # -- API operations: acknowledged when the call returns ----------------------------------------
    async def api_step(self, op: Op) -> None:
        assert self.opened is not None
        service, party = self.opened.service, BY_LABEL[op.label]
        call: Callable[[], Awaitable[Any]] | None = None
        if op.kind == "claim" and party.kind == "interactive":
            self.binding = service.begin_run(
                f"run-{party.task_key}", party.conversation or "", party.conversation
            )
            token = self.binding.stdio_env(SERVER)["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]
            req = ClaimRequest(task_key=party.task_key, task_hash=f"h-{party.task_key}", deadline=DEADLINE)
            call = functools.partial(service.claim, token, req)
        elif op.kind == "claim":
            dreq = DetachedClaimRequest(
                route=party.route or "",
                task_key=party.task_key,
                task_hash=f"h-{party.task_key}",
                deadline=DEADLINE,
            )
            call = functools.partial(service.detached_claim, SERVER, ENVIRON[TOKEN_ENV], dreq)
        elif op.label not in self.claims:
            pass  # the host never learnt of this claim (only under injected faults)
        elif op.kind == "finalize" and self.binding is not None:
            call = functools.partial(self.binding.finalize, ORIGIN_HISTORY)
        elif op.kind == "activate" and self.binding is not None:
            call = self.binding.activate
        elif op.kind == "result":
            claimed = self.claims[op.label]
            rreq = result_request(party, self.w.seed)
            call = functools.partial(
                service.submit_result, claimed.continuation_id, claimed.result_token, rreq, body_length(rreq)
            )
        if call is None:  # what it needs never came back (only under injected faults)
            self.journal.fail(op.number, None, refused=True)
            return
        out = await self.journal.attempt_async(op.number, call, poisoned=self.poisoned)
        if self.journal.outcomes.get(op.number) != "acked":
            return
        if op.kind == "claim":
            assert isinstance(out, ClaimResponse)
            expected = self.opened.ids[op.label]
            if out.continuation_id != expected and not self.journal.tolerant:
                raise WorkloadError(f"claim {op.label} answered id {out.continuation_id}, not {expected}")
            self.claims[op.label] = out
            self.journal.fact(f"{op.label}.id", out.continuation_id)
        elif op.kind == "result":
            accepted = result_request(party, self.w.seed)
            self.journal.fact(
                f"{op.label}.result", f"{accepted.idempotency_key}/{accepted.payload_hash[:16]}"
            )
        reached = REACHED_BY.get(op.kind)
        if reached is not None:
            self.journal.fact(f"{op.label}.reached.{reached}", "yes")

    # -- worker operations: acknowledged when their commit is announced ----------------------------
    async def worker_step(self, step: tuple[Op, ...]) -> None:
        assert self.opened is not None
        label = step[0].label
        cid = self.opened.ids[label]
        self.chain, self.chain_label = list(step), label
        self._begin(step[0])
        try:
            await self.opened.worker.synthesize(cid)
            await self.opened.worker.deliver(cid)  # must find nothing left to do
        except Exception as exc:
            if not self.journal.tolerant:
                raise
            if self.chain:
                refused = self.begun_poisoned and isinstance(exc, DiskFailedError | StoreClosedError)
                self._refuse(self._fail_begun(exc, refused=refused))
        else:
            if self.chain and not self.journal.tolerant:
                raise WorkloadError(f"worker step {label} stopped before {[o.kind for o in self.chain]}")
            self._refuse(self.chain)  # nothing was committed for them
        self.chain = []
        if self.errors:
            raise WorkloadError("; ".join(self.errors))

    def _begin(self, op: Op) -> None:
        self.begun_poisoned = self.poisoned()
        self.journal.begin(op.number)
        if self._paired():
            # With the outbox the answer and the in-flight mark may be one commit: both begin.
            self.journal.begin(self.chain[1].number)

    def _paired(self) -> bool:
        """The outbox workload's answer op, followed by its in-flight op (begun together)."""
        chain = self.chain
        return self.w.outbox and len(chain) > 1 and chain[0].kind == "text" and chain[1].kind == "in-flight"

    def _fail_begun(self, exc: BaseException | None, *, refused: bool) -> list[Op]:
        """Fail the begun op (and the in-flight op begun with it); returns the ops never begun."""
        begun = 2 if self._paired() else 1
        for op in self.chain[:begun]:
            self.journal.fail(op.number, exc, refused=refused)
        return self.chain[begun:]

    def _refuse(self, ops: Sequence[Op]) -> None:
        for op in ops:
            self.journal.fail(op.number, None, refused=True)

    def _advance(self, matches: Callable[[Op], bool], what: str) -> None:
        """A commit of the running worker step landed: acknowledge the operation it completes."""
        if not self.chain:
            return
        hit = next((i for i, op in enumerate(self.chain) if matches(op)), None)
        if hit is None or hit > 0:
            if not self.journal.tolerant:
                # Raised after the step: the worker would swallow it here, inside its commit.
                self.errors.append(f"unexpected commit in worker step {self.chain_label}: {what}")
                return
            # Under injected faults a step may be skipped (a history append that failed and was
            # swallowed): the begun op failed, the ones never begun did nothing.
            begun = len(self.chain) - len(self._fail_begun(None, refused=False))
            if hit is None:
                self._refuse(self.chain[begun:])
                self.chain = []
                return
            self._refuse(self.chain[begun:hit])
            self.chain = self.chain[hit:]
            self._begin(self.chain[0])
        op = self.chain.pop(0)
        self.journal.ack(op.number, what)
        reached = REACHED_BY.get(op.kind)
        if reached is not None:
            self.journal.fact(f"{op.label}.reached.{reached}", "yes")
        if op.kind == "text" and self.w.local:
            # A local run is seen by nobody until its answer commits: only then may it never
            # be synthesized again.
            self.journal.fact(f"{op.label}.synthesis", "never again")
        if self.chain:
            self._begin(self.chain[0])

    def _committed(self, old: Continuation | None, new: Continuation) -> None:
        if not self.chain or self.label_of.get(new.id) != self.chain_label:
            return
        was_chunks = len(old.chunk_receipts) if old is not None else 0
        was_attempts = old.attempts.delivery if old is not None else 0

        def matches(op: Op) -> bool:
            if op.kind == "synth-start":
                return new.state == "synthesizing"
            if op.kind == "text":
                return new.state == "ready_to_deliver" and new.attempts.delivery == was_attempts
            if op.kind == "in-flight":  # by the attempt count: a missing in-flight mark must show
                return new.attempts.delivery == was_attempts + 1
            if op.kind == "chunk":
                return len(new.chunk_receipts) == was_chunks + 1
            if op.kind == "delivered":
                return new.state == "delivered" and new.receipt is not None and new.receipt.kind == "posted"
            if op.kind == "silent":
                return new.state == "delivered" and new.completion_kind == "silent"
            return False

        what = f"{new.state}{' in flight' if new.delivery_in_flight else ''}"
        folded = old is not None and old.state == "result_received" and new.state == "ready_to_deliver"
        if self._paired() and folded and new.delivery_in_flight:
            # The answer and the in-flight mark in one commit (the outbox can reconcile).
            self._advance(lambda op: op.kind == "text", what)
            self._advance(lambda op: op.kind == "in-flight", what)
            return
        self._advance(matches, what)

    def _history(self, conversation_id: str) -> None:
        if self.chain and BY_LABEL[self.chain_label].conversation == conversation_id:
            self._advance(lambda op: op.kind == "history", "history appended")

    # -- the outside world ---------------------------------------------------------------------------
    def _synthesizing(self, cid: str) -> None:
        if not self.w.local:  # a model was asked: from now on it must never be asked again
            self.journal.fact(f"{self.label_of.get(cid, cid)}.synthesis", "never again")

    def _posted(self, delivery: ChunkDelivery) -> None:
        keys = [p.delivery_key for p in self.channel.posts]
        if keys.count(delivery.delivery_key) > 1:
            self.duplicates.append(delivery.delivery_key)
        if self.w.outbox:
            return  # what the outbox holds is declared once durable (_durable)
        cid = delivery.delivery_key.partition(":")[0]
        self.journal.fact(f"{self.label_of.get(cid, cid)}.posted", "never again")

    def _durable(self, delivery: ChunkDelivery) -> None:
        cid, _, index = delivery.delivery_key.partition(":")
        label = self.label_of.get(cid, cid)
        self.journal.fact(f"{label}.line{index}", "present")
        if self.chain and self.chain_label == label:
            self._advance(lambda op: op.kind == "post", f"line {index} durable")


@register
class LocalSynthesisLifecycle(ContinuationLifecycle):
    """The same scenario with a local synthesizer (as the template is): each answer is one commit
    from ``result_received`` to ``ready_to_deliver``, and a crash before that commit leaves the
    result to be synthesized again, which nothing outside the process can tell apart."""

    name = "lifecycle-local"
    summary = "continuation lifecycle with a local (template-like) synthesizer: no synthesizing commit"
    default_ops = 18
    local = True


@register
class OutboxLifecycle(LocalSynthesisLifecycle):
    """The local-synthesizer scenario delivering to the real outbox (``outbox.jsonl`` beside the
    state directory, on the recorded disk): each answer and its in-flight mark are one commit,
    every post is an operation acknowledged once its line is durable, and recovery settles an
    interrupted delivery from the lines the outbox holds (reconciliation) instead of declaring
    it unknown."""

    name = "lifecycle-outbox"
    summary = (
        "continuation lifecycle with a local synthesizer and the outbox: answer + in flight in one commit"
    )
    default_ops = 21
    outbox = True

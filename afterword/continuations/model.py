"""Records of the continuation core (msgspec Structs; stored as msgpack in the record store)."""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

State = Literal[
    "claimed",
    "result_received",
    "synthesizing",
    "ready_to_deliver",
    "delivery_retry",
    "delivered",
    "delivery_unknown",
    "expired",
    "cancelled",
    "dead_lettered",
]
STATES: tuple[State, ...] = get_args(State)
TERMINAL: frozenset[str] = frozenset(
    {"delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"}
)
# delivery_unknown is terminal for the worker but needs an operator: it is still "active"
# for nothing else. Records in these states are not admitted against the active limits.

OriginContext = Literal["pending", "pinned", "abandoned", "detached_latest", "legacy_missing", "scrubbed"]
ORIGIN_CONTEXTS: tuple[OriginContext, ...] = get_args(OriginContext)
Mode = Literal["reply", "notify_if_actionable", "capture", "silent"]
MODES: tuple[Mode, ...] = get_args(Mode)
Kind = Literal["interactive", "detached"]
CompletionKind = Literal["synthesized", "origin_context_unavailable", "suppressed", "silent"]

FALLBACK_TEXT = (
    "The background task finished, but I could not safely restore the original conversation "
    "context. Please ask me to check the result again."
)
MAX_ERROR_MESSAGE = 512
MAX_DELIVERY_ATTEMPTS = 20


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str

    @classmethod
    def bounded(cls, code: str, message: str) -> ErrorInfo:
        return cls(code=code[:64], message=message[:MAX_ERROR_MESSAGE])


class Attempts(msgspec.Struct, frozen=True, kw_only=True):
    synthesis: int = 0
    delivery: int = 0


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """Proof of the terminal outcome of a delivered continuation."""

    kind: Literal["posted", "captured", "suppressed", "silent", "operator"]
    delivered_at_ms: int
    channel_id: str | None = None
    delivery_ids: tuple[str, ...] = ()
    history_recorded: bool = True
    history_error_code: str | None = None


INLINE_PAYLOAD_MAX = 16 * 1024  # larger result payloads are kept out of line, as blobs


class StateChange(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One entry of a record's bounded state history (``Continuation.history``)."""

    state: State
    at_ms: int
    error: str | None = None  # the last error code when the state was entered


class ResultRecord(msgspec.Struct, frozen=True, kw_only=True):
    """An accepted result. The payload (compact JSON with sorted keys, exactly as hashed) is
    either inline in ``payload`` or, when larger than ``INLINE_PAYLOAD_MAX``, in the payload
    blob store under ``payload_digest`` (its blake3 digest) with ``payload`` empty. Records
    written before out-of-line payloads existed have no digest and load unchanged."""

    idempotency_key: str
    payload_hash: str
    payload: bytes = b""
    received_at_ms: int
    payload_digest: str | None = None
    payload_size: int | None = (
        None  # bytes of the out-of-line file (checked at open); None before it was kept
    )


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """Immutable claim metadata; its HMAC (``Continuation.claim_mac``) proves it unaltered."""

    id: str
    kind: Kind
    server_name: str
    run_id: str | None
    conversation_id: str | None  # the exact origin bucket (interactive) or route conversation
    reply_to: str | None  # physical route for reply mode
    route: str | None  # named route (detached or named-route interactive)
    mode: Mode
    task_key: str
    task_hash: str
    deadline_ms: int
    fingerprint: str
    created_at_ms: int


class TaskBacking(msgspec.Struct, frozen=True, kw_only=True):
    """The MCP task a task-backed continuation waits on (docs/tasks-bridge.md): its result is
    fetched from the server (``tasks/get``) instead of PUT by a producer. The server is the
    claim's ``server_name``; a loopback HTTP server's URL is read from the MCP config by that
    name whenever it is needed, never stored or taken from a request."""

    task_id: str
    follow: Literal["service", "host"]
    status: str  # the last status the server reported (or the handle's)
    poll_interval_ms: int | None = None  # the server's latest hint, as given
    ttl_ms: int | None = None
    reported_at_ms: int | None = None  # the last outcome applied (None: only the handle)
    # follow "host": the continuation is dead-lettered ``task_host_gone`` when no report
    # arrives before this (renewed by every report while the task runs).
    host_lease_until_ms: int | None = None
    # tasks/cancel is owed to the server (the continuation was cancelled, or the task asked
    # for input nobody can give). Durable before it is sent; never undone by its failure.
    cancel_requested: bool = False
    cancel_sent_at_ms: int | None = None  # when the sender recorded its attempt
    cancel_ok: bool | None = None
    cancel_detail: str | None = None  # bounded; why a tasks/cancel failed


class Continuation(msgspec.Struct, frozen=True, kw_only=True):
    claim: Claim
    claim_mac: str
    state: State = "claimed"
    origin_context: OriginContext = "pending"
    snapshot_digest: str | None = None
    snapshot_mac: str | None = None
    result: ResultRecord | None = None
    text: str | None = None
    completion_kind: CompletionKind | None = None
    attempts: Attempts = Attempts()
    next_attempt_at_ms: int | None = None
    delivery_in_flight: bool = False
    chunk_receipts: tuple[str, ...] = ()
    last_error: ErrorInfo | None = None
    receipt: Receipt | None = None
    updated_at_ms: int = 0
    terminal_at_ms: int | None = None
    legacy: bool = False
    legacy_id: str | None = None
    history_boundary: int | None = None
    # Sticky: some post of this answer began and its outcome was never proven. Every later
    # post needs an operator's explicit unsafe opt-in (``repost_allowed``), whatever state
    # the record passed through since; it is never cleared.
    post_unproven: bool = False
    # The operator retried with allow_unknown; lasts until the record is terminal again.
    repost_allowed: bool = False
    # An operator acknowledged this terminal outcome (dead letter, expiry, or a delivery
    # missing from history): it no longer affects health and becomes subject to retention.
    acknowledged_at_ms: int | None = None
    # Delivery attempts made before operator retries reset ``attempts.delivery`` (which bounds
    # one round of automatic retries); their sum is how many posts may have happened.
    delivery_attempts_before: int = 0
    # The states this record went through, oldest first, bounded (see continuations.trail).
    history: tuple[StateChange, ...] = ()
    # Set for a task-backed continuation (MCP Tasks bridge); None for every claim a producer
    # answers, and in every record written before the bridge existed.
    task: TaskBacking | None = None

    @property
    def id(self) -> str:
        return self.claim.id

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def deferred(self) -> bool:
        """A result is held back until the origin is settled (activated or abandoned)."""
        return self.origin_context == "pending"


class Tombstone(msgspec.Struct, frozen=True, kw_only=True):
    """A compacted terminal continuation: enough to answer repeated claims and results."""

    claim: Claim
    claim_mac: str
    state: State
    idempotency_key: str | None
    payload_hash: str | None
    completion_kind: CompletionKind | None
    receipt: Receipt | None
    terminal_at_ms: int
    last_error: ErrorInfo | None = None
    # Tombstones written before attempts were kept decode with zeros (their counts are lost).
    attempts: Attempts = Attempts()
    post_unproven: bool = False
    acknowledged_at_ms: int | None = None
    history: tuple[StateChange, ...] = ()
    # The origin context the record had when it was compacted; None in tombstones written
    # before it was kept (shown as "scrubbed": compaction dropped the snapshot reference).
    origin_context: OriginContext | None = None
    # Receipts of chunks posted before the record ended without a full receipt (a partial
    # answer resolved as dead-lettered): proof of a delivery is never compacted away.
    chunk_receipts: tuple[str, ...] = ()
    task: TaskBacking | None = None  # kept so ``show`` still names the task after compaction


class TombstoneSummary(msgspec.Struct, frozen=True, array_like=True, gc=False, forbid_unknown_fields=True):
    """What the indexes, health and retention read of one tombstone (see
    ``continuations.summary``): kept for every tombstone, the tombstone itself read on demand."""

    id: str
    state: State
    created_at_ms: int
    terminal_at_ms: int
    cause: str | None  # attention(tombstone): the health cause it carries, if any
    server_name: str
    route: str | None


class Activation(msgspec.Struct, frozen=True, kw_only=True):
    """Group activation marker: the origin run committed; its claims may proceed."""

    run_id: str
    conversation_id: str
    history_boundary: int
    activated_at_ms: int
    claim_ids: tuple[str, ...]


_enc = msgspec.msgpack.Encoder()
_dec_cont = msgspec.msgpack.Decoder(Continuation)
_dec_tomb = msgspec.msgpack.Decoder(Tombstone)
_dec_act = msgspec.msgpack.Decoder(Activation)
_claim_json = msgspec.json.Encoder(order="sorted")


def encode(obj: Continuation | Tombstone | Activation) -> bytes:
    return _enc.encode(obj)


def decode_continuation(data: bytes) -> Continuation:
    return _dec_cont.decode(data)


def decode_tombstone(data: bytes) -> Tombstone:
    return _dec_tomb.decode(data)


def decode_activation(data: bytes) -> Activation:
    return _dec_act.decode(data)


def canonical_claim(claim: Claim) -> bytes:
    """Deterministic bytes of the immutable claim metadata (input of every binding HMAC)."""
    return _claim_json.encode(claim)

"""``DurableHistory``: conversation history on the record store, one WAL commit per append.

Layout: one record per message, keyed ``history/<h>/<seq>`` where ``<h>`` is the first 32 hex
digits of the blake3 digest of the conversation id (record keys are short and restricted,
conversation ids are neither) and ``<seq>`` a 16-digit hex counter, so keys sort by age. The
record keeps the real conversation id; a record whose id disagrees with its key's digest is a
collision or tampering and fails closed.

The in-memory index follows committed state through a ``afterword.store.Collection``: every instance over
the same store sees every other instance's commits, and nothing is visible before it is
durable. Appends to one conversation are serialized by a lock shared by all instances over
the same store; the expected-absent version on the first new key turns any writer that
bypasses the lock into a ``VersionConflict`` instead of a lost message.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice

import anyio
import blake3
import msgspec

from ..errors import AfterwordError
from ..store import (
    Collection,
    Delete,
    KeyLock,
    PendingCommit,
    Put,
    RecordStore,
    RecordTooLarge,
    VersionConflict,
    shared_locks,
)
from ..wal import TransactionTooLarge
from .errors import (
    HistoryCorruptError,
    HistoryError,
    InvalidMessageError,
    MessageIdConflict,
    MessageTooLarge,
    ToolCallIdReused,
)
from .message import Message
from .pairing import open_tool_calls

Guard = Callable[[Sequence[Message]], bool]
"""Checked under the append lock with the conversation's tail, in-flight appends included."""


class _Refused(AfterwordError):
    """A guarded append whose guard said no (internal)."""


PREFIX = "history/"
DIGEST_CHARS = 32
MAX_MESSAGE_ID_CHARS = 256
_CONFLICT_RETRIES = 3


class StoredMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The durable record of one message: its conversation, position and body."""

    conversation_id: str
    seq: int
    message: Message


_encoder = msgspec.msgpack.Encoder()


def _corrupt(key: str, message: str) -> HistoryCorruptError:
    return HistoryCorruptError(message)


def conversation_digest(conversation_id: str) -> str:
    """The fixed-length key part for a conversation id (any length, any characters)."""
    return blake3.blake3(conversation_id.encode()).hexdigest()[:DIGEST_CHARS]


def message_key(digest: str, seq: int) -> str:
    return f"{PREFIX}{digest}/{seq:016x}"


@dataclass
class _Conversation:
    conversation_id: str
    seqs: list[int] = field(default_factory=list)  # sorted ascending
    by_seq: dict[int, Message] = field(default_factory=dict)
    by_id: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)  # tool call id -> seq of its opener


@dataclass
class _InFlight:
    """Appends of one conversation reserved in the store but not yet durable."""

    seqs: list[int] = field(default_factory=list)  # ascending
    messages: dict[int, Message] = field(default_factory=dict)  # by seq, for boundary checks
    deleting: set[int] = field(default_factory=set)
    ids: dict[str, anyio.Event] = field(default_factory=dict)  # set when that append settles


_inflight: weakref.WeakKeyDictionary[RecordStore, dict[str, _InFlight]] = weakref.WeakKeyDictionary()


def _check_message(message: Message) -> None:
    if not message.id or len(message.id) > MAX_MESSAGE_ID_CHARS:
        raise InvalidMessageError(f"message id must be 1-{MAX_MESSAGE_ID_CHARS} characters")
    if message.role == "tool" and not message.tool_call_id:
        raise InvalidMessageError(f"message {message.id!r}: a tool message needs tool_call_id")
    if message.tool_calls and message.role != "assistant":
        raise InvalidMessageError(f"message {message.id!r}: only an assistant message opens tool calls")
    if not all(message.call_ids()):
        raise InvalidMessageError(f"message {message.id!r}: a tool call needs a non-empty id")


def _check_reuse(conv: _Conversation | None, flight: _InFlight, batch: dict[str, Message]) -> None:
    """Refuse a held id with another body and a tool call id opened before (see ``append``)."""
    pending = {m.id: m for m in flight.messages.values()}
    opened = {c for m in flight.messages.values() for c in m.call_ids()}
    for message in batch.values():
        earlier = pending.get(message.id)
        if earlier is None and conv is not None and message.id in conv.by_id:
            earlier = conv.by_seq[conv.by_id[message.id]]
        if earlier is not None:
            if earlier != message:
                raise MessageIdConflict(
                    f"message id {message.id!r} is already in the conversation with a different body"
                )
            continue
        for call_id in message.call_ids():
            if call_id in opened or (conv is not None and call_id in conv.calls):
                raise ToolCallIdReused(
                    f"message {message.id!r} opens tool call {call_id!r}, which the conversation "
                    "already opened"
                )
            opened.add(call_id)


class DurableHistory:
    """Bounded conversation history on a :class:`RecordStore`.

    Idempotency by message id covers the retained messages: once a message has been trimmed
    by the bound, its id is forgotten like its body.

    Args:
        store: an open record store (shared with other consumers; keys under ``history/``).
        max_messages: per conversation; an append that would exceed it deletes the oldest
            messages in the same transaction.
    """

    def __init__(self, store: RecordStore, *, max_messages: int = 1000) -> None:
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        self.store = store
        self.max_messages = max_messages
        self._conversations: dict[str, _Conversation] = {}
        self._locks = shared_locks(store, "history:conversations")
        # Raises here for a bad record already stored; one committed later makes every use of
        # this history raise (the collection fails closed).
        self._messages = Collection(store, PREFIX, StoredMessage, on_change=self._index, error=_corrupt)

    def _check(self) -> None:
        self._messages.check()

    def _index(self, id_: str, old: StoredMessage | None, new: StoredMessage | None) -> None:
        key = PREFIX + id_
        digest, _, seq_hex = id_.partition("/")
        try:
            seq = int(seq_hex, 16)
        except ValueError:
            raise HistoryCorruptError(f"history record key {key!r} has no sequence number") from None
        if new is None:
            conv = self._conversations.get(digest)
            if conv is not None and seq in conv.by_seq:
                removed = conv.by_seq.pop(seq)
                conv.by_id.pop(removed.id, None)
                for call_id in removed.call_ids():
                    if conv.calls.get(call_id) == seq:
                        del conv.calls[call_id]
                del conv.seqs[bisect.bisect_left(conv.seqs, seq)]
                if not conv.seqs:
                    del self._conversations[digest]
            return
        stored = new
        if stored.seq != seq or conversation_digest(stored.conversation_id) != digest:
            raise HistoryCorruptError(f"history record {key!r} does not match its key")
        conv = self._conversations.get(digest)
        if conv is None:
            conv = self._conversations[digest] = _Conversation(stored.conversation_id)
        elif conv.conversation_id != stored.conversation_id:
            raise HistoryCorruptError(
                f"history key {digest} is shared by two conversation ids (digest collision)"
            )
        if seq in conv.by_seq:
            conv.by_id.pop(conv.by_seq[seq].id, None)
        else:
            bisect.insort(conv.seqs, seq)
        conv.by_seq[seq] = stored.message
        conv.by_id[stored.message.id] = seq
        for call_id in stored.message.call_ids():
            conv.calls.setdefault(call_id, seq)

    def _conversation(self, conversation_id: str) -> _Conversation | None:
        self._check()
        conv = self._conversations.get(conversation_digest(conversation_id))
        if conv is not None and conv.conversation_id != conversation_id:
            raise HistoryCorruptError(
                f"conversation {conversation_id!r} collides with {conv.conversation_id!r}"
            )
        return conv

    def _lock(self, digest: str) -> KeyLock:
        return self._locks.lock(digest)

    # -- the ConversationHistory contract ------------------------------------------------------
    async def append(self, conversation_id: str, messages: Sequence[Message]) -> None:
        """Append atomically in one WAL transaction; messages already held are skipped.

        Ids are unique within the retained conversation: re-appending a held message is a
        no-op, but a different message under a held id, or a tool call id an earlier message
        already opened, is refused (nothing of the batch is written).

        Raises:
            InvalidMessageError: a malformed message, one id twice with different bodies, or a
                batch larger than ``max_messages``.
            MessageIdConflict: a held message id with a different body.
            ToolCallIdReused: a tool call id the conversation already opened.
            MessageTooLarge: the batch does not fit one record store transaction.
        """
        await self._append(conversation_id, messages, None)

    async def append_at_boundary(
        self, conversation_id: str, messages: Sequence[Message], *, window: int = 256
    ) -> bool:
        """Append only while no tool call is open; False (nothing written) otherwise.

        The check and the reservation are one step under the conversation's append lock, and
        the check reads messages other appends have reserved but not yet made durable: they
        come before this append in the log whatever order the fsyncs finish in. So a message
        appended here can never land between a tool call and its result. ``window`` is how
        many of the newest messages are read for the check.
        """

        def closed(tail: Sequence[Message]) -> bool:
            return not open_tool_calls(tail)

        try:
            await self._append(conversation_id, messages, (window, closed))
        except _Refused:
            return False
        return True

    async def _append(
        self, conversation_id: str, messages: Sequence[Message], guard: tuple[int, Guard] | None
    ) -> None:
        batch: dict[str, Message] = {}
        for message in messages:
            _check_message(message)
            earlier = batch.get(message.id)
            if earlier is not None and earlier != message:
                raise InvalidMessageError(f"message id {message.id!r} appears twice with different bodies")
            batch.setdefault(message.id, message)
        if len(batch) > self.max_messages:
            raise InvalidMessageError(f"batch of {len(batch)} messages exceeds max_messages")
        digest = conversation_digest(conversation_id)
        # The lock covers only choosing sequence numbers and reserving the transaction; the
        # fsync is awaited outside it, so concurrent appends to one conversation share a
        # group commit instead of queueing behind one fsync each.
        async with self._lock(digest):
            for attempt in range(_CONFLICT_RETRIES):
                try:
                    reserved = self._reserve_locked(conversation_id, digest, batch, guard)
                    break
                except VersionConflict:
                    # Another writer bypassed the shared lock; wait for its commit to apply.
                    if attempt == _CONFLICT_RETRIES - 1:
                        raise
                    await anyio.sleep(0)
        pending, others, settle = reserved
        if pending is not None:
            # Shielded: the reservation is in the log either way, and the in-flight bookkeeping
            # must stay until it is applied, or a later append could pick the same sequence.
            with anyio.CancelScope(shield=True):
                try:
                    await pending.wait()
                finally:
                    settle()
        for event in others:  # the same message id is being appended by someone else
            await event.wait()
        missing = [m for m in batch if not self.has_message(conversation_id, m)]
        if missing and pending is None:
            raise HistoryError(f"a concurrent append of message {missing[0]!r} did not commit")

    def _reserve_locked(
        self,
        conversation_id: str,
        digest: str,
        batch: dict[str, Message],
        guard: tuple[int, Guard] | None,
    ) -> tuple[PendingCommit | None, list[anyio.Event], Callable[[], None]]:
        conv = self._conversation(conversation_id)
        held = conv.by_id if conv is not None else {}
        flight = _inflight.setdefault(self.store, {}).setdefault(digest, _InFlight())
        others = [flight.ids[m] for m in batch if m not in held and m in flight.ids]
        _check_reuse(conv, flight, batch)
        fresh = [m for m in batch.values() if m.id not in held and m.id not in flight.ids]
        if not fresh:
            return None, others, lambda: None
        applied = conv.seqs if conv is not None else []
        if guard is not None:
            window, check = guard
            tail = [conv.by_seq[seq] for seq in applied[-window:]] if conv is not None else []
            tail += [flight.messages[seq] for seq in flight.seqs]  # reserved: later in the log
            if not check(tail[-window:]):
                raise _Refused
        last = max(applied[-1] if applied else -1, flight.seqs[-1] if flight.seqs else -1)
        next_seq = last + 1
        new_seqs = [next_seq + offset for offset in range(len(fresh))]
        mutations: list[Put | Delete] = []
        for seq, message in zip(new_seqs, fresh, strict=True):
            body = _encoder.encode(StoredMessage(conversation_id=conversation_id, seq=seq, message=message))
            mutations.append(Put(message_key(digest, seq), body))
        # Trim to the bound counting appends still in flight; a message being deleted by an
        # earlier in-flight append is not counted twice.
        # A later transaction may delete a message an earlier in-flight one writes: both apply
        # in lsn order, so the bound holds however many appends overlap.
        # Counted without listing every retained seq (an append must not cost O(history)):
        # the seqs being deleted are few, and the doomed ones are the oldest live ones.
        deleting = flight.deleting
        held_seqs = conv.by_seq if conv is not None else {}
        dead = sum((seq in held_seqs) + (seq in flight.messages) for seq in deleting)
        excess = len(applied) + len(flight.seqs) - dead + len(fresh) - self.max_messages
        doomed = (
            list(islice((seq for seq in chain(applied, flight.seqs) if seq not in deleting), excess))
            if excess > 0
            else []
        )
        mutations.extend(Delete(message_key(digest, seq)) for seq in doomed)
        try:
            pending = self.store.reserve(mutations, expect={message_key(digest, next_seq): None})
        except (RecordTooLarge, TransactionTooLarge) as exc:
            raise MessageTooLarge(str(exc)) from None
        done = anyio.Event()
        flight.seqs.extend(new_seqs)
        flight.messages.update(zip(new_seqs, fresh, strict=True))
        flight.deleting.update(doomed)
        for message in fresh:
            flight.ids[message.id] = done

        def settle() -> None:
            for seq in new_seqs:
                flight.seqs.remove(seq)
                flight.messages.pop(seq, None)
            flight.deleting.difference_update(doomed)
            for message in fresh:
                flight.ids.pop(message.id, None)
            done.set()

        return pending, others, settle

    async def latest(self, conversation_id: str, limit: int) -> list[Message]:
        conv = self._conversation(conversation_id)
        if conv is None or limit <= 0:
            return []
        return [conv.by_seq[seq] for seq in conv.seqs[-limit:]]

    def has_message(self, conversation_id: str, message_id: str) -> bool:
        conv = self._conversation(conversation_id)
        return conv is not None and message_id in conv.by_id

    # -- extras --------------------------------------------------------------------------------
    def count(self, conversation_id: str) -> int:
        """How many messages the conversation currently retains."""
        conv = self._conversation(conversation_id)
        return len(conv.seqs) if conv is not None else 0

    def __repr__(self) -> str:
        return f"<DurableHistory conversations={len(self._conversations)} max_messages={self.max_messages}>"

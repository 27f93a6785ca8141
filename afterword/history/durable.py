"""``DurableHistory``: conversation history on the record store, one WAL commit per append.

Layout: one record per message, keyed ``history/<h>/<seq>`` where ``<h>`` is the first 32 hex
digits of the blake3 digest of the conversation id (record keys are short and restricted,
conversation ids are neither) and ``<seq>`` a 16-digit hex counter, so keys sort by age. The
record keeps the real conversation id; a record whose id disagrees with its key's digest is a
collision or tampering and fails closed.

The in-memory index follows committed state through ``RecordStore.watch``: every instance over
the same store sees every other instance's commits, and nothing is visible before it is
durable. Appends to one conversation are serialized by a lock shared by all instances over
the same store; the expected-absent version on the first new key turns any writer that
bypasses the lock into a ``VersionConflict`` instead of a lost message.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import blake3
import msgspec

from ..store import Delete, Put, Record, RecordStore, RecordTooLarge, VersionConflict
from ..wal import TransactionTooLarge
from .errors import HistoryCorruptError, InvalidMessageError, MessageTooLargeError
from .message import Message

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
_decoder = msgspec.msgpack.Decoder(StoredMessage)


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


# Locks shared by every DurableHistory over the same store, per conversation digest.
_locks: weakref.WeakKeyDictionary[RecordStore, dict[str, anyio.Lock]] = weakref.WeakKeyDictionary()


def _check_message(message: Message) -> None:
    if not message.id or len(message.id) > MAX_MESSAGE_ID_CHARS:
        raise InvalidMessageError(f"message id must be 1-{MAX_MESSAGE_ID_CHARS} characters")
    if message.role == "tool" and not message.tool_call_id:
        raise InvalidMessageError(f"message {message.id!r}: a tool message needs tool_call_id")
    if message.tool_calls and message.role != "assistant":
        raise InvalidMessageError(f"message {message.id!r}: only an assistant message opens tool calls")


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
        self._corrupt: HistoryCorruptError | None = None
        self._loading = True
        store.watch(PREFIX, self._on_change)  # raises here for a bad record already stored
        self._loading = False

    # -- index maintenance (called by the store after each durable commit) ---------------------
    def _on_change(self, key: str, old: Record | None, new: Record | None) -> None:
        try:
            self._index(key, new)
        except HistoryCorruptError as exc:
            if self._loading:
                raise
            # Raising inside the store's apply loop would leave its memory half-applied; fail
            # closed on this history's next use instead.
            self._corrupt = exc

    def _check(self) -> None:
        if self._corrupt is not None:
            raise self._corrupt

    def _index(self, key: str, new: Record | None) -> None:
        digest, _, seq_hex = key[len(PREFIX) :].partition("/")
        try:
            seq = int(seq_hex, 16)
        except ValueError:
            raise HistoryCorruptError(f"history record key {key!r} has no sequence number") from None
        if new is None:
            conv = self._conversations.get(digest)
            if conv is not None and seq in conv.by_seq:
                removed = conv.by_seq.pop(seq)
                conv.by_id.pop(removed.id, None)
                del conv.seqs[bisect.bisect_left(conv.seqs, seq)]
                if not conv.seqs:
                    del self._conversations[digest]
            return
        try:
            stored = _decoder.decode(new.value)
        except msgspec.DecodeError as exc:
            raise HistoryCorruptError(f"history record {key!r}: {exc}") from None
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

    def _conversation(self, conversation_id: str) -> _Conversation | None:
        self._check()
        conv = self._conversations.get(conversation_digest(conversation_id))
        if conv is not None and conv.conversation_id != conversation_id:
            raise HistoryCorruptError(
                f"conversation {conversation_id!r} collides with {conv.conversation_id!r}"
            )
        return conv

    def _lock(self, digest: str) -> anyio.Lock:
        per_store = _locks.setdefault(self.store, {})
        lock = per_store.get(digest)
        if lock is None:
            lock = per_store[digest] = anyio.Lock()
        return lock

    # -- the ConversationHistory contract ------------------------------------------------------
    async def append(self, conversation_id: str, messages: Sequence[Message]) -> None:
        """Append atomically in one WAL transaction; messages already held are skipped.

        Raises:
            InvalidMessageError: a malformed message, one id twice with different bodies, or a
                batch larger than ``max_messages``.
            MessageTooLargeError: the batch does not fit one record store transaction.
        """
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
        async with self._lock(digest):
            for attempt in range(_CONFLICT_RETRIES):
                try:
                    await self._append_locked(conversation_id, digest, batch)
                    return
                except VersionConflict:
                    # Another writer bypassed the shared lock; the index now shows its commit.
                    if attempt == _CONFLICT_RETRIES - 1:
                        raise
                    await anyio.sleep(0)

    async def _append_locked(self, conversation_id: str, digest: str, batch: dict[str, Message]) -> None:
        conv = self._conversation(conversation_id)
        held = conv.by_id if conv is not None else {}
        fresh = [m for m in batch.values() if m.id not in held]
        if not fresh:
            return
        existing = conv.seqs if conv is not None else []
        next_seq = existing[-1] + 1 if existing else 0
        mutations: list[Put | Delete] = []
        for offset, message in enumerate(fresh):
            seq = next_seq + offset
            body = _encoder.encode(StoredMessage(conversation_id=conversation_id, seq=seq, message=message))
            mutations.append(Put(message_key(digest, seq), body))
        excess = len(existing) + len(fresh) - self.max_messages
        mutations.extend(Delete(message_key(digest, seq)) for seq in existing[: max(excess, 0)])
        try:
            await self.store.transact(mutations, expect={message_key(digest, next_seq): None})
        except (RecordTooLarge, TransactionTooLarge) as exc:
            raise MessageTooLargeError(str(exc)) from None

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

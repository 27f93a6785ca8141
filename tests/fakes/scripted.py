"""Scriptable in-process world for the whole-service stateful test: a kill switch that cuts the
service at any commit point, and a channel and a synthesizer that do what a script says.

The kill switch is the store's ``observe_transaction`` hook. Once it trips, every later
transaction is refused, so nothing the process does after that moment becomes durable, which is
what a crash leaves behind; the test then reopens the state directory. A post, unlike a
transaction, cannot be taken back: the channel keeps every post it accepted in memory, outside
the state directory, so the test can count them across any number of restarts.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from afterword.disk import DiskError
from afterword.history import Message
from afterword.store import TransactionInfo
from afterword.worker import ChunkDelivery, ChunkReceipt, SynthesisRequest
from afterword.worker.errors import (
    PermanentDeliveryError,
    RetryableDeliveryError,
    UnconfirmedDeliveryError,
)


class SimulatedCrash(DiskError):
    """The process died here: this transaction and every later one never reach the disk."""


@dataclass
class KillSwitch:
    """Counts, measures and (when armed) refuses the store's transactions."""

    max_payload: int
    max_record: int
    dead: bool = False
    countdown: int | None = None  # trip at the n-th next transaction
    transactions: int = 0
    largest_payload: int = 0
    largest_record: int = 0
    oversized: list[str] = field(default_factory=list)  # I5 violations, described
    listener: Callable[[TransactionInfo], None] | None = None  # sees every transaction let through

    def observe(self, info: TransactionInfo) -> None:
        if self.dead:
            raise SimulatedCrash("the process is dead")
        if self.countdown is not None:
            self.countdown -= 1
            if self.countdown <= 0:
                self.trip()
                raise SimulatedCrash("crashed at a commit point")
        self.transactions += 1
        self.largest_payload = max(self.largest_payload, info.payload_bytes)
        self.largest_record = max(self.largest_record, info.largest_value)
        if info.payload_bytes > self.max_payload or info.largest_value > self.max_record:
            keys = sorted({op.key.split("/", 1)[0] for op in info.ops})
            self.oversized.append(
                f"{info.payload_bytes} bytes in {len(info.ops)} records ({keys}), largest {info.largest_value}"
            )
        if self.listener is not None:
            self.listener(info)

    def trip(self) -> None:
        self.dead = True
        self.countdown = None

    def revive(self) -> None:
        self.dead = False
        self.countdown = None


CHANNEL_MODES = (
    "accept",
    "refuse",  # permanent refusal, nothing posted
    "transient",  # retryable failure, nothing posted
    "unconfirmed",  # posted, but the channel could not confirm it
    "timeout",  # posted, then never answers (the worker's delivery timeout cuts it)
    "crash_before",  # the process dies as the post starts: nothing posted
    "crash_after",  # the process dies right after the post went out
)


@dataclass(frozen=True)
class Post:
    delivery_key: str
    conversation_id: str
    text: str
    epoch: int  # the continuation's unsafe-retry count when it was posted


class ScriptedChannel:
    """Does the next scripted thing for each post (``accept`` when the script is empty)."""

    max_chunk_chars = 200

    def __init__(
        self, switch: KillSwitch, epoch_of: Callable[[str], int], allowed: Callable[[str], bool]
    ) -> None:
        self.switch = switch
        self.epoch_of = epoch_of
        self.allowed = allowed  # the configured allow list in force
        self.forbidden: list[str] = []  # posts to a destination the configuration revoked
        self.script: deque[str] = deque()
        self.posts: list[Post] = []  # every post that reached the conversation
        self.calls = 0
        # A held post (operator verbs racing a post in flight): the next post announces itself
        # on ``arrived``, waits for ``release()``, then does ``hold_next``. ``held_receipt`` is
        # the delivery id it answered with, if it answered.
        self.hold_next: str | None = None
        self.arrived = threading.Event()
        self.gate: anyio.Event | None = None
        self.held_receipt: str | None = None

    def _posted(self, delivery: ChunkDelivery) -> None:
        cid = delivery.delivery_key.rsplit(":", 1)[0]
        self.posts.append(
            Post(delivery.delivery_key, delivery.conversation_id, delivery.text, self.epoch_of(cid))
        )

    async def post(self, delivery: ChunkDelivery) -> ChunkReceipt:
        self.calls += 1
        if not self.allowed(delivery.conversation_id):
            self.forbidden.append(delivery.conversation_id)
        if self.hold_next is not None:
            return await self._held(delivery, self.hold_next)
        mode = self.script.popleft() if self.script else "accept"
        if mode == "refuse":
            raise PermanentDeliveryError("channel_refused", "the channel refused the post")
        if mode == "transient":
            raise RetryableDeliveryError("channel_unavailable", "try again later")
        if mode == "crash_before":
            self.switch.trip()
            raise SimulatedCrash("died before posting")
        self._posted(delivery)
        if mode == "unconfirmed":
            raise UnconfirmedDeliveryError("connection dropped after sending")
        if mode == "timeout":
            await anyio.sleep_forever()
        if mode == "crash_after":
            self.switch.trip()
            raise SimulatedCrash("died after posting")
        return ChunkReceipt(delivery_id=f"m{len(self.posts)}", channel_id="C-fake")

    async def _held(self, delivery: ChunkDelivery, mode: str) -> ChunkReceipt:
        """The receiver got the post (unless ``mode`` says nothing was posted) and holds its
        answer until the test releases it, while the test runs an operator verb."""
        self.hold_next = None
        self.held_receipt = None
        self.gate = anyio.Event()
        posted = mode in ("accept", "unconfirmed")
        if posted:
            self._posted(delivery)
        self.arrived.set()
        await self.gate.wait()
        if mode == "refuse":
            raise PermanentDeliveryError("channel_refused", "the channel refused the post")
        if mode == "transient":
            raise RetryableDeliveryError("channel_unavailable", "try again later")
        if mode == "unconfirmed":
            raise UnconfirmedDeliveryError("connection dropped after sending")
        self.held_receipt = f"m{len(self.posts)}"
        return ChunkReceipt(delivery_id=self.held_receipt, channel_id="C-fake")

    def release(self) -> None:
        """Let the held post answer (called on the service's event loop)."""
        if self.gate is not None:
            self.gate.set()

    def duplicates(self) -> list[tuple[str, int]]:
        """Delivery keys posted more than once within one unsafe-retry epoch (I1)."""
        counts = Counter((p.delivery_key, p.epoch) for p in self.posts)
        return [key for key, n in counts.items() if n > 1]


SYNTH_MODES = ("ok", "fail", "empty", "timeout", "crash")


class ScriptedSynth:
    """Answers with text whose length the payload chooses (``chunks`` channel posts), or does
    the next scripted failure."""

    def __init__(self, switch: KillSwitch) -> None:
        self.switch = switch
        self.script: deque[str] = deque()
        self.calls: Counter[str] = Counter()  # continuation id -> synthesis calls

    async def synthesize(self, request: SynthesisRequest) -> str:
        self.calls[request.continuation_id] += 1
        mode = self.script.popleft() if self.script else "ok"
        if mode == "fail":
            raise RuntimeError("the model failed")
        if mode == "empty":
            return ""
        if mode == "timeout":
            await anyio.sleep_forever()
        if mode == "crash":
            self.switch.trip()
            raise SimulatedCrash("died during synthesis")
        payload = request.payload if isinstance(request.payload, dict) else {}
        chunks = int(payload.get("chunks", 1))
        word = f"answer-{request.continuation_id[-6:]}"
        words = max(1, (ScriptedChannel.max_chunk_chars * chunks - 20) // (len(word) + 1))
        return " ".join([word] * words)


HISTORY_MODES = ("ok", "fail", "crash")


class ScriptedHistory:
    """The service's own durable history, behind a script that can make an append fail (a
    delivered answer missing from history) or kill the process during it. ``inner`` is set once
    the store is open."""

    def __init__(self, switch: KillSwitch) -> None:
        self.switch = switch
        self.inner: Any = None
        self.script: deque[str] = deque()

    async def append(self, conversation_id: str, messages: Sequence[Message]) -> None:
        mode = self.script.popleft() if self.script else "ok"
        if mode == "fail":
            raise RuntimeError("the history backend is down")
        if mode == "crash":
            self.switch.trip()
            raise SimulatedCrash("died appending history")
        await self.inner.append(conversation_id, messages)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

"""The immutable origin snapshot: whole retained turns ending with the origin pair (pure).

Caps: at most 64 messages, 64 KiB of content per message, 256 KiB of content in total. Size
pressure removes whole oldest turns. Content is never truncated and a user message is never
separated from the assistant reply that follows it; if the origin pair alone does not fit,
the snapshot cannot be built and the origin turn must fail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from .errors import SnapshotError

MAX_MESSAGES = 64
MAX_MESSAGE_BYTES = 64 * 1024
MAX_TOTAL_BYTES = 256 * 1024


class SnapshotMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    role: Literal["user", "assistant"]
    content: str


class Snapshot(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    version: int = 1
    conversation_id: str
    history_boundary: int  # messages of the conversation the origin run had committed
    messages: tuple[SnapshotMessage, ...]


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(Snapshot)


def encode_snapshot(snapshot: Snapshot) -> bytes:
    return _encoder.encode(snapshot)


def decode_snapshot(data: bytes) -> Snapshot:
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"snapshot does not decode: {exc}") from None


def _message(item: Mapping[str, object] | SnapshotMessage, index: int) -> SnapshotMessage:
    if isinstance(item, SnapshotMessage):
        return item
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "assistant") or not isinstance(content, str):
        raise SnapshotError(f"history[{index}]: needs role user|assistant and string content")
    return SnapshotMessage(role=role, content=content)


def split_turns(messages: Sequence[SnapshotMessage]) -> list[list[SnapshotMessage]]:
    """A turn starts at each user message; messages before the first user form one turn."""
    turns: list[list[SnapshotMessage]] = []
    for msg in messages:
        if msg.role == "user" or not turns:
            turns.append([msg])
        else:
            turns[-1].append(msg)
    return turns


def _size(msg: SnapshotMessage) -> int:
    return len(msg.content.encode())


def newest_whole_turns(
    messages: Sequence[SnapshotMessage],
    *,
    max_messages: int = MAX_MESSAGES,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
) -> list[SnapshotMessage]:
    """The newest whole turns of ``messages`` that fit the caps, oldest first (maybe none).

    Walking back from the newest turn, the first turn that does not fit ends the walk: older
    turns are dropped whole, and no message is ever truncated or separated from its turn.
    """
    kept: list[list[SnapshotMessage]] = []
    count = 0
    total = 0
    for turn in reversed(split_turns(messages)):
        t_count = len(turn)
        t_total = sum(_size(m) for m in turn)
        fits = (
            count + t_count <= max_messages
            and total + t_total <= max_total_bytes
            and all(_size(m) <= max_message_bytes for m in turn)
        )
        if not fits:
            break
        kept.append(turn)
        count += t_count
        total += t_total
    return [m for turn in reversed(kept) for m in turn]


def build_snapshot(
    conversation_id: str,
    history: Sequence[Mapping[str, object] | SnapshotMessage],
    *,
    max_messages: int = MAX_MESSAGES,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
) -> Snapshot:
    """Keep the newest whole turns that fit the caps; the origin pair must be last and fit."""
    messages = [_message(item, i) for i, item in enumerate(history)]
    if len(messages) < 2 or messages[-2].role != "user" or messages[-1].role != "assistant":
        raise SnapshotError("history must end with the origin user/assistant pair")
    ordered = newest_whole_turns(
        messages,
        max_messages=max_messages,
        max_message_bytes=max_message_bytes,
        max_total_bytes=max_total_bytes,
    )
    if not ordered:
        raise SnapshotError(
            "the origin turn alone exceeds the snapshot caps "
            f"({max_messages} messages, {max_message_bytes} bytes each, {max_total_bytes} total)"
        )
    return Snapshot(
        conversation_id=conversation_id,
        history_boundary=len(messages),
        messages=tuple(ordered),
    )

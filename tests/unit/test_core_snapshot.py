"""The origin snapshot builder: caps, whole-turn dropping, and the origin pair rule.

Property tests check the invariants on generated histories (with small caps so every branch
is reached quickly) and a few examples pin the real caps: 64 messages, 64 KiB per message,
256 KiB in total.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afterword.continuations import SnapshotError
from afterword.continuations.snapshot import (
    MAX_MESSAGE_BYTES,
    MAX_MESSAGES,
    MAX_TOTAL_BYTES,
    Snapshot,
    SnapshotMessage,
    build_snapshot,
    decode_snapshot,
    encode_snapshot,
    split_turns,
)

CONV = "slack:C1:T1#2024-03-09"
KIB = 1024


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def pair(i: int, size: int = 10) -> list[dict[str, str]]:
    return [msg("user", f"u{i}:" + "u" * size), msg("assistant", f"a{i}:" + "a" * size)]


def as_dicts(messages: Sequence[SnapshotMessage]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def nbytes(m: dict[str, str]) -> int:
    return len(m["content"].encode())


# -- generated histories ---------------------------------------------------------------------
# Content mixes 1-byte and 2-byte characters so the byte caps (not character counts) matter.
content = st.builds(
    lambda n, wide, tag: tag + ("é" if wide else "x") * n,
    st.integers(min_value=0, max_value=60),
    st.booleans(),
    st.sampled_from(["", "#", "q:"]),
)
turn = st.tuples(content, st.lists(content, min_size=0, max_size=3)).map(
    lambda t: [msg("user", t[0]), *(msg("assistant", c) for c in t[1])]
)


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, str]]:
    lead = draw(st.lists(content, max_size=2))  # assistant messages before the first user turn
    turns = draw(st.lists(turn, max_size=12))
    origin = [msg("user", draw(content)), msg("assistant", draw(content))]
    return [*(msg("assistant", c) for c in lead), *(m for t in turns for m in t), *origin]


def _turns_of(history: list[dict[str, str]]) -> list[list[dict[str, str]]]:
    turns: list[list[dict[str, str]]] = []
    for m in history:
        if m["role"] == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return turns


def _fits(turns: list[list[dict[str, str]]], max_messages: int, max_message: int, max_total: int) -> bool:
    flat = [m for t in turns for m in t]
    return (
        len(flat) <= max_messages
        and all(nbytes(m) <= max_message for m in flat)
        and sum(nbytes(m) for m in flat) <= max_total
    )


@settings(max_examples=300, deadline=None)
@given(
    histories(),
    st.integers(min_value=2, max_value=20),
    st.integers(min_value=0, max_value=120),
    st.integers(min_value=0, max_value=600),
)
def test_snapshot_properties(
    history: list[dict[str, str]], max_messages: int, max_message: int, max_total: int
) -> None:
    turns = _turns_of(history)
    origin_fits = _fits(turns[-1:], max_messages, max_message, max_total)
    try:
        snap = build_snapshot(
            CONV,
            history,
            max_messages=max_messages,
            max_message_bytes=max_message,
            max_total_bytes=max_total,
        )
    except SnapshotError:
        assert not origin_fits  # only an origin turn that cannot fit may fail
        return
    assert origin_fits
    kept = as_dicts(snap.messages)
    # 1. Caps hold.
    assert _fits([kept], max_messages, max_message, max_total)
    # 2. It is exactly the newest k whole turns: a suffix, content untouched, no partial turn.
    k = next(k for k in range(1, len(turns) + 1) if [m for t in turns[-k:] for m in t] == kept)
    # 3. It ends with the origin user/assistant pair.
    assert kept[-2:] == history[-2:]
    # 4. Only size pressure drops turns: the next older turn would have broken a cap.
    if k < len(turns):
        assert not _fits(turns[-(k + 1) :], max_messages, max_message, max_total)
    assert snap.conversation_id == CONV
    assert snap.history_boundary == len(history)
    assert decode_snapshot(encode_snapshot(snap)) == snap


@settings(max_examples=100, deadline=None)
@given(histories())
def test_snapshot_never_splits_a_user_assistant_pair(history: list[dict[str, str]]) -> None:
    snap = build_snapshot(CONV, history, max_messages=5, max_message_bytes=200, max_total_bytes=600)
    kept = as_dicts(snap.messages)
    start = len(history) - len(kept)
    assert history[start:] == kept
    # The first kept message starts a turn: it is a user message, or nothing precedes it.
    assert start == 0 or kept[0]["role"] == "user"


# -- the real caps ---------------------------------------------------------------------------
def test_default_caps_are_the_documented_ones() -> None:
    assert (MAX_MESSAGES, MAX_MESSAGE_BYTES, MAX_TOTAL_BYTES) == (64, 64 * KIB, 256 * KIB)


def test_message_count_cap_drops_whole_oldest_turns() -> None:
    history = [m for i in range(40) for m in pair(i)]  # 80 messages
    snap = build_snapshot(CONV, history)
    assert len(snap.messages) == 64
    assert as_dicts(snap.messages) == history[-64:]
    assert snap.messages[0].content.startswith("u8:")


def test_count_cap_with_odd_turn_sizes_keeps_fewer_rather_than_split() -> None:
    # 21 turns of three messages (63) plus the origin pair (2) = 65 > 64: the oldest whole
    # three-message turn goes, leaving 62, never 64 with a torn turn.
    history = [
        *(m for i in range(21) for m in [msg("user", f"u{i}"), msg("assistant", "a"), msg("assistant", "b")]),
        *pair(99),
    ]
    snap = build_snapshot(CONV, history)
    assert len(snap.messages) == 62
    assert snap.messages[0] == SnapshotMessage(role="user", content="u1")


def test_exactly_at_caps_is_kept_whole() -> None:
    big = "x" * (64 * KIB)  # exactly the per-message cap
    history = [msg("user", big), msg("assistant", big), msg("user", big), msg("assistant", big)]
    snap = build_snapshot(CONV, history)  # exactly 256 KiB in total
    assert len(snap.messages) == 4
    assert all(len(m.content) == 64 * KIB for m in snap.messages)  # never truncated


def test_total_cap_drops_oldest_turns() -> None:
    big = "x" * (60 * KIB)
    history = [m for i in range(4) for m in (msg("user", f"{i}" + big), msg("assistant", "ok"))]
    snap = build_snapshot(CONV, history)
    assert len(snap.messages) == 8  # four turns of about 60 KiB: 240 KiB fits
    # One more turn of 40 KiB in front pushes the total past 256 KiB: it goes, whole.
    history = [*pair(0, 20 * KIB), *history]
    snap = build_snapshot(CONV, history)
    assert as_dicts(snap.messages) == history[2:]
    assert sum(len(m.content.encode()) for m in snap.messages) <= MAX_TOTAL_BYTES


def test_oversized_message_drops_its_whole_turn_and_everything_older() -> None:
    history = [
        *pair(0),
        msg("user", "huge follows"),
        msg("assistant", "y" * (64 * KIB + 1)),
        msg("assistant", "small tail of the same turn"),
        *pair(1),
        *pair(2),
    ]
    snap = build_snapshot(CONV, history)
    assert as_dicts(snap.messages) == [*pair(1), *pair(2)]


def test_per_message_cap_counts_utf8_bytes() -> None:
    wide = "é" * (32 * KIB + 1)  # 32 Ki+1 characters, 64 KiB + 2 bytes
    history = [msg("user", "q"), msg("assistant", wide), *pair(1)]
    assert as_dicts(build_snapshot(CONV, history).messages) == pair(1)


@pytest.mark.parametrize(
    "origin",
    [
        [msg("user", "x" * (64 * KIB + 1)), msg("assistant", "ok")],
        [msg("user", "q"), msg("assistant", "é" * (32 * KIB + 1))],
        [msg("user", "x" * (64 * KIB)), msg("assistant", "y" * (64 * KIB))],  # fits the defaults
    ],
)
def test_origin_pair_too_large_fails(origin: list[dict[str, str]]) -> None:
    history = [*pair(0), *origin]
    if all(nbytes(m) <= 64 * KIB for m in origin):
        # Control case: the same shape within the caps is fine.
        assert as_dicts(build_snapshot(CONV, history).messages) == history
        with pytest.raises(SnapshotError, match="origin turn"):
            build_snapshot(CONV, history, max_total_bytes=128 * KIB - 1)
        return
    with pytest.raises(SnapshotError, match="origin turn"):
        build_snapshot(CONV, history)


def test_origin_pair_over_message_count_fails() -> None:
    with pytest.raises(SnapshotError):
        build_snapshot(CONV, pair(0), max_messages=1)


@pytest.mark.parametrize(
    "history",
    [
        [],
        [msg("user", "only")],
        [msg("assistant", "a"), msg("assistant", "b")],
        [*pair(0), msg("user", "no answer yet")],
        [msg("assistant", "x"), msg("user", "reversed")],
        [msg("user", "q"), {"role": "system", "content": "s"}, msg("assistant", "a")],
        [msg("user", "q"), {"role": "tool", "content": "t"}],
        [msg("user", "q"), {"role": "assistant", "content": 5}],
        [msg("user", "q"), {"role": "assistant"}],
    ],
)
def test_invalid_histories_fail(history: list[dict[str, object]]) -> None:
    with pytest.raises(SnapshotError) as info:
        build_snapshot(CONV, history)
    assert info.value.status == 400


def test_rollover_bucket_is_kept_exactly() -> None:
    snap = build_snapshot("slack:C1:T1#2023-12-31", pair(0))
    assert snap.conversation_id == "slack:C1:T1#2023-12-31"
    assert decode_snapshot(encode_snapshot(snap)).conversation_id == "slack:C1:T1#2023-12-31"


def test_snapshot_encoding_is_deterministic() -> None:
    a = build_snapshot(CONV, pair(0))
    typed = [SnapshotMessage(role=m["role"], content=m["content"]) for m in pair(0)]  # type: ignore[arg-type]
    b = build_snapshot(CONV, typed)
    assert encode_snapshot(a) == encode_snapshot(b)  # same content, same blob digest


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b'{"version":1}',
        b'{"version":1,"conversation_id":"c","history_boundary":2,"messages":[{"role":"system","content":"x"}]}',
        b'{"version":1,"conversation_id":"c","history_boundary":2,"messages":[],"extra":1}',
    ],
)
def test_decode_rejects_malformed_snapshots(data: bytes) -> None:
    with pytest.raises(SnapshotError):
        decode_snapshot(data)


def test_split_turns() -> None:
    roles = ["assistant", "user", "assistant", "assistant", "user", "user"]
    ms = [SnapshotMessage(role=r, content=str(i)) for i, r in enumerate(roles)]  # type: ignore[arg-type]
    assert [[m.content for m in t] for t in split_turns(ms)] == [["0"], ["1", "2", "3"], ["4"], ["5"]]
    assert Snapshot(conversation_id="c", history_boundary=0, messages=()).version == 1

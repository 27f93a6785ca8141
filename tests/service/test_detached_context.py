"""A detached route's latest-history context is bounded in bytes as well as in count (issue 13
item 9): the origin snapshot's caps apply (64 messages, 64 KiB per message, 256 KiB in all),
and size pressure drops whole oldest turns, through the same builder."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes.harness import make_config, running
from fakes.producer import wait_state
from fakes.synth import RecordingSynth

from afterword.continuations.snapshot import (
    MAX_MESSAGE_BYTES,
    MAX_TOTAL_BYTES,
    SnapshotMessage,
    newest_whole_turns,
)
from afterword.history import Message

CONVERSATION = "slack:C_DAILY:T_1"  # the daily-attention route's conversation
KIB = 1024


def turn(i: int, user_bytes: int) -> list[Message]:
    return [
        Message(id=f"u{i}", role="user", content=f"{i:03d}" + "x" * (user_bytes - 3)),
        Message(id=f"a{i}", role="assistant", content=f"a{i:03d}"),
    ]


async def detached_context(tmp_path: Path, history: list[Message]) -> list[tuple[str, str]]:
    synth = RecordingSynth("Noted.")
    config, env = make_config(tmp_path)
    async with running(config, env, synthesizer=synth) as h:
        await h.worker.history.append(CONVERSATION, history)
        claimed = await h.producer.detached(config.base_url, "daily-attention", "daily-1")
        assert (await h.producer.submit(claimed, {"summary": "2 alerts"})).status_code == 200
        rec = await wait_state(h.service, claimed.id)
    assert rec.state == "delivered" and rec.origin_context == "detached_latest"
    [request] = synth.calls
    return [(m.role, m.content) for m in request.messages]


@pytest.mark.anyio
async def test_the_total_cap_drops_whole_oldest_turns(tmp_path: Path) -> None:
    history = [m for i in range(8) for m in turn(i, 50 * KIB)]  # 8 x ~50 KiB, 16 messages
    context = await detached_context(tmp_path, history)
    assert sum(len(c.encode()) for _, c in context) <= MAX_TOTAL_BYTES
    assert [c[:3] for r, c in context if r == "user"] == ["003", "004", "005", "006", "007"]
    assert [r for r, _ in context] == ["user", "assistant"] * 5  # whole turns only


@pytest.mark.anyio
async def test_an_oversized_message_ends_the_context_at_its_turn(tmp_path: Path) -> None:
    history = [
        *turn(0, 10),
        *turn(1, MAX_MESSAGE_BYTES + 1),  # alone it breaks the per-message cap
        *turn(2, 10),
        *turn(3, 10),
    ]
    context = await detached_context(tmp_path, history)
    assert [c[:3] for r, c in context if r == "user"] == ["002", "003"]
    assert all(len(c.encode()) <= MAX_MESSAGE_BYTES for _, c in context)


def test_the_shared_builder_keeps_nothing_when_even_the_newest_turn_is_too_big() -> None:
    big = [SnapshotMessage(role="user", content="x" * (MAX_MESSAGE_BYTES + 1))]
    assert newest_whole_turns(big) == []
    ok = [SnapshotMessage(role="assistant", content="lead"), SnapshotMessage(role="user", content="q")]
    assert newest_whole_turns(ok) == ok  # a leading partial turn counts as one turn

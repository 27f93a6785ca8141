"""DurableHistory and tool-call pairing: atomic, idempotent, bounded, durable appends."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest

from afterword.history import (
    DurableHistory,
    HistoryCorruptError,
    InvalidMessageError,
    Message,
    MessageTooLarge,
    StoredMessage,
    open_tool_calls,
    pairing_closed,
)
from afterword.store import Put, RecordStore, StoreOptions
from afterword.wal import WalOptions

OPTIONS = StoreOptions(wal=WalOptions(segment_size=4 * 1024 * 1024, max_payload=1024 * 1024, zero_fill=False))
KEY_RE = re.compile(r"^[A-Za-z0-9._:@#/+=-]{1,120}$")


def user(i: int | str, text: str | None = None) -> Message:
    return Message(id=f"m{i}", role="user", content=text or f"hello {i}")


@pytest.fixture
def store(state_dir: str) -> Iterator[RecordStore]:
    s = RecordStore.open(state_dir, options=OPTIONS)
    yield s
    s.close()


@pytest.mark.anyio
async def test_append_and_latest_oldest_first(store: RecordStore) -> None:
    history = DurableHistory(store)
    await history.append("c1", [user(1), user(2)])
    await history.append("c1", [user(3)])
    assert [m.id for m in await history.latest("c1", 10)] == ["m1", "m2", "m3"]
    assert [m.id for m in await history.latest("c1", 2)] == ["m2", "m3"]
    assert await history.latest("c1", 0) == []
    assert await history.latest("other", 5) == []
    assert history.has_message("c1", "m2")
    assert not history.has_message("c2", "m2")


@pytest.mark.anyio
async def test_reappending_an_existing_id_is_a_no_op(store: RecordStore) -> None:
    history = DurableHistory(store)
    await history.append("c1", [user(1), user(2)])
    commits = store.statistics().wal_commits
    await history.append("c1", [user(1), user(2)])
    assert store.statistics().wal_commits == commits  # nothing written at all
    await history.append("c1", [user(2), user(3)])  # partial overlap: only m3 is new
    assert [m.id for m in await history.latest("c1", 10)] == ["m1", "m2", "m3"]
    assert store.statistics().wal_commits == commits + 1


@pytest.mark.anyio
async def test_one_wal_transaction_per_append(store: RecordStore) -> None:
    history = DurableHistory(store)
    commits = store.statistics().wal_commits
    await history.append("c1", [user(i) for i in range(20)])
    assert store.statistics().wal_commits == commits + 1


@pytest.mark.anyio
async def test_append_is_all_or_nothing(store: RecordStore) -> None:
    history = DurableHistory(store)
    await history.append("c1", [user(1)])
    bad_tool = Message(id="t", role="tool", content="no call id")
    with pytest.raises(InvalidMessageError):
        await history.append("c1", [user(2), bad_tool])
    huge = user(4, "x" * (3 * 1024 * 1024))  # above the store's 2 MiB per-record bound
    with pytest.raises(MessageTooLarge):
        await history.append("c1", [user(3), huge])
    with pytest.raises(InvalidMessageError):
        await history.append("c1", [user(5, "a"), user(5, "b")])
    with pytest.raises(InvalidMessageError):  # only an assistant opens tool calls
        await history.append("c1", [Message(id="u", role="user", content="", tool_calls=("x",))])
    assert [m.id for m in await history.latest("c1", 10)] == ["m1"]


@pytest.mark.anyio
async def test_bounded_oldest_deleted_in_the_same_transaction(store: RecordStore) -> None:
    history = DurableHistory(store, max_messages=5)
    for i in range(4):
        await history.append("c1", [user(i)])
    commits = store.statistics().wal_commits
    await history.append("c1", [user(4), user(5), user(6)])
    assert store.statistics().wal_commits == commits + 1
    assert [m.id for m in await history.latest("c1", 100)] == ["m2", "m3", "m4", "m5", "m6"]
    assert not history.has_message("c1", "m0")
    assert len(list(store.items("history/"))) == 5
    with pytest.raises(InvalidMessageError):
        await history.append("c1", [user(f"big{i}") for i in range(6)])


@pytest.mark.anyio
async def test_messages_and_their_meta_survive_a_reopen_and_take_appends(state_dir: str) -> None:
    meta: dict[str, str | int | bool | None] = {"kind": "x", "n": 3, "flag": True, "none": None}
    opener = Message(id="a1", role="assistant", content="", tool_calls=("call-1",), meta=meta)
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        history = DurableHistory(store)
        await history.append("conv", [user(1), opener])
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        history = DurableHistory(store)
        got = await history.latest("conv", 10)
        assert got == [user(1), opener]
        assert history.has_message("conv", "a1")
        await history.append("conv", [Message(id="r1", role="tool", content="ok", tool_call_id="call-1")])
        assert [m.id for m in await history.latest("conv", 10)] == ["m1", "a1", "r1"]


@pytest.mark.anyio
async def test_long_and_odd_conversation_ids_get_short_valid_keys(store: RecordStore) -> None:
    history = DurableHistory(store)
    odd = "slack:C1:T1#2024-01-01 with spaces, ünïcode and / slashes " * 10
    await history.append(odd, [user(1)])
    await history.append("short", [user(1)])
    keys = [r.key for r in store.items("history/")]
    assert len(keys) == 2
    assert all(KEY_RE.match(k) for k in keys)
    assert [m.id for m in await history.latest(odd, 5)] == ["m1"]
    stored = [msgspec.msgpack.decode(r.value, type=StoredMessage) for r in store.items("history/")]
    assert {s.conversation_id for s in stored} == {odd, "short"}


@pytest.mark.anyio
async def test_concurrent_appends_from_two_instances_lose_nothing(store: RecordStore) -> None:
    a, b = DurableHistory(store), DurableHistory(store)

    async def writer(history: DurableHistory, tag: str) -> None:
        for i in range(15):
            await history.append("c", [user(f"{tag}{i}")])

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer, a, "a")
        tg.start_soon(writer, b, "b")
    ids = [m.id for m in await a.latest("c", 100)]
    assert sorted(ids) == sorted([f"ma{i}" for i in range(15)] + [f"mb{i}" for i in range(15)])
    assert ids == [m.id for m in await b.latest("c", 100)]  # both indexes saw every commit
    assert [i for i in ids if i.startswith("ma")] == [f"ma{i}" for i in range(15)]


@pytest.mark.anyio
async def test_a_record_that_disagrees_with_its_key_fails_closed(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        history = DurableHistory(store)
        await history.append("real", [user(1)])
        (record,) = list(store.items("history/"))
        forged = StoredMessage(conversation_id="someone-else", seq=0, message=user(1))
        # A live instance does not raise inside the store's apply loop; it refuses its next use.
        await store.transact([Put(record.key, msgspec.msgpack.encode(forged))])
        with pytest.raises(HistoryCorruptError):
            await history.latest("real", 5)
        with pytest.raises(HistoryCorruptError):
            await history.append("real", [user(2)])
    with RecordStore.open(state_dir, options=OPTIONS) as store, pytest.raises(HistoryCorruptError):
        DurableHistory(store)


def test_open_tool_calls_tracks_pairing() -> None:
    opener = Message(id="a", role="assistant", content="", tool_calls=("c1", "c2"))
    r1 = Message(id="r1", role="tool", content="1", tool_call_id="c1")
    r2 = Message(id="r2", role="tool", content="2", tool_call_id="c2")
    stray = Message(id="r9", role="tool", content="?", tool_call_id="unknown")
    assert open_tool_calls([]) == set()
    assert open_tool_calls([user(0), opener]) == {"c1", "c2"}
    assert open_tool_calls([opener, r1]) == {"c2"}
    assert open_tool_calls([opener, r2, stray, r1]) == set()
    assert pairing_closed([opener, r1, r2, user(1)])
    assert not pairing_closed([opener, r1, user(1)])


@pytest.mark.anyio
async def test_concurrent_appends_to_one_conversation_share_fsyncs(tmp_path: Path) -> None:
    """The per-conversation lock is not held across the fsync: appends group-commit."""
    import os

    os.chmod(tmp_path, 0o700)
    with RecordStore.open(str(tmp_path / "s")) as store:
        history = DurableHistory(store, max_messages=15)
        before = store.wal.stats.fsyncs
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(
                    history.append, "slack:C1:T1", [Message(id=f"m{i}", role="user", content=str(i))]
                )
        fsyncs = store.wal.stats.fsyncs - before
        assert fsyncs < 20, fsyncs
        kept = await history.latest("slack:C1:T1", 100)
        assert len(kept) == 15  # bounded, oldest trimmed
        assert [int(m.content) for m in kept] == sorted(int(m.content) for m in kept)
        # sequences are contiguous and every appended id not trimmed is present exactly once
        assert len({m.id for m in kept}) == 15
        await history.append("slack:C1:T1", [Message(id="m19", role="user", content="19")])  # idempotent
        assert len(await history.latest("slack:C1:T1", 100)) == 15

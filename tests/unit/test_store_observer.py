"""The store's ``observe_transaction`` test hook: it sees every transaction with its exact
size before anything is written, and an exception it raises refuses the transaction."""

from __future__ import annotations

import pytest

from afterword.store import Delete, Put, RecordStore, StoreOptions, TransactionInfo
from afterword.store.codec import encode_tx
from afterword.wal import TransactionTooLarge, WalOptions


class Refused(Exception):
    pass


@pytest.mark.anyio
async def test_the_observer_sees_each_transaction_and_can_refuse_it(state_dir: str) -> None:
    seen: list[TransactionInfo] = []
    refuse = False

    def observe(info: TransactionInfo) -> None:
        seen.append(info)
        if refuse:
            raise Refused()

    store = RecordStore.open(state_dir, options=StoreOptions(observe_transaction=observe))
    try:
        await store.transact([Put("a", b"x" * 100), Put("b", b"y")])
        store.transact_sync([Delete("b")])
        assert [[op.key for op in info.ops] for info in seen] == [["a", "b"], ["b"]]
        assert seen[0].payload_bytes == len(encode_tx(seen[0].ops))
        assert seen[0].largest_value == 100 and seen[1].largest_value == 0
        refuse = True
        with pytest.raises(Refused):
            await store.transact([Put("c", b"z")])
        with pytest.raises(Refused):
            store.transact_sync([Put("c", b"z")])
        assert store.get("c") is None
    finally:
        store.close()
    with RecordStore.open(state_dir) as again:  # nothing refused reached the log
        assert again.get("c") is None and again.get("a") is not None and again.get("b") is None


@pytest.mark.anyio
async def test_an_oversized_transaction_is_observed_before_the_log_refuses_it(state_dir: str) -> None:
    seen: list[int] = []
    options = StoreOptions(
        wal=WalOptions(segment_size=64 * 1024, max_payload=4096, zero_fill=False),
        observe_transaction=lambda info: seen.append(info.payload_bytes),
    )
    with RecordStore.open(state_dir, options=options) as store, pytest.raises(TransactionTooLarge):
        await store.transact([Put(f"k{i}", b"v" * 1000) for i in range(5)])
    assert seen and seen[0] > 4096

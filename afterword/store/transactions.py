"""Turning a caller's mutations into one checked, encoded transaction (pure, no I/O).

The checks run in this order, and any failure leaves nothing written: every key valid and
named once; every expectation met (:class:`VersionConflict`); the test observer told; every
value within the per-record limit (:class:`RecordTooLarge`). Each operation carries the
version its key had before it (``prior``), which replay uses to carry the MANIFEST's digest
forward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from .codec import Op, check_key, encode_tx
from .errors import RecordTooLarge, VersionConflict
from .types import Mutation, Put, StoreOptions, TransactionInfo


def build_transaction(
    mutations: Sequence[Mutation],
    expect: Mapping[str, int | None] | None,
    latest_version: Callable[[str], int | None],
    options: StoreOptions,
) -> tuple[tuple[Op, ...], bytes]:
    """Validate ``mutations`` against ``latest_version``; return the ops and their encoding."""
    ops: list[Op] = []
    seen: set[str] = set()
    for m in mutations:
        check_key(m.key)
        if m.key in seen:
            raise ValueError(f"key {m.key!r} appears twice in one transaction")
        seen.add(m.key)
        if isinstance(m, Put):
            ops.append(Op(m.key, m.value, tuple(m.blobs), latest_version(m.key) or 0))
        else:
            ops.append(Op(m.key, None, (), latest_version(m.key) or 0))
    for key, expected in (expect or {}).items():
        actual = latest_version(key)
        if actual != expected:
            raise VersionConflict(key, expected, actual)
    frozen = tuple(ops)
    data = encode_tx(frozen)
    observe = options.observe_transaction
    if observe is not None:
        observe(TransactionInfo(frozen, len(data)))
    for op in ops:
        if op.value is not None and len(op.value) > options.max_record_bytes:
            raise RecordTooLarge(
                f"record {op.key!r}: {len(op.value)} bytes exceeds {options.max_record_bytes}"
            )
    return frozen, data

"""Replay of the log at open: one pass in Python, before any watcher subscribes.

What replay must produce depends only on each key's last operation, and on the digests:

* **State.** Log lsns only grow, so a key's last operation is its newest; it applies exactly
  when it is newer than the key's version before replay (its record file or catalog entry),
  and then every earlier operation on the key applied too. One record image is built per
  key, from its last after-image. The pass over the log keeps only each key's last lsn (a
  plain int: holding each key's decoded operation kept ~10 MiB of values alive and cost more
  than decoding the ~10,000 final transactions a second time at the end).
* **The MANIFEST's digest carried forward** (``ReplayCheck``): each operation subtracts
  ``h(key, prior)`` and each put adds ``h(key, lsn)``. See :func:`_last_ops` for why only
  the ends of each chain of operations on a key are hashed.
* **The state's own digest**: minus each replaced pre-replay version, plus each key's final
  version (a version written and replaced within the log is added and removed: neither is
  hashed).

Sums are modulo 2**128 and commute, so the order of the terms does not matter.
``tests/unit/test_store_replay_fused.py`` holds the per-operation definition (subtract the prior,
add the put, apply the after-image) and checks this pass against it on generated logs,
including logs that do not match their records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec
import xxhash

from ..wal.layout import Frame
from ..wal.log_frames import LogFrames
from .catalog import CatalogEntry
from .codec import Op, RecordImage, _tx_decoder
from .errors import StoreCorruptError
from .evidence import Digest, ReplayCheck


def replay_last_images(
    frames: LogFrames | Iterable[Frame],
    check: ReplayCheck,
    records: dict[str, RecordImage],
    unread: dict[str, CatalogEntry],
    dirty: set[str],
    blob_refs: Counter[str],
    digest: Digest,
) -> None:
    """Bring a ``CommittedState``'s parts through ``frames`` (increasing lsn order), carrying
    ``check`` along; nothing changes if a transaction cannot be decoded."""
    h = xxhash.xxh3_128_intdigest
    decode = _tx_decoder.decode
    # Payloads are decoded straight from the segment images (spans, no copies).
    frames = frames if isinstance(frames, LogFrames) else LogFrames.from_frames(frames)
    last: dict[str, int] = {}  # key -> lsn of its last operation; negative for a delete
    try:
        if check.newer:
            _reproduce_newer(frames, check.newer)
        chain_ends = _last_ops(frames, last)
    except msgspec.DecodeError as exc:
        raise StoreCorruptError(f"undecodable transaction: {exc}") from None
    assert len(chain_ends) % 3 == 0, "chain ends come as (key, put kept, prior subtracted)"

    # The MANIFEST's digest: the ends of the chains broken inside the log...
    e_added = e_removed = e_count = 0
    it = iter(chain_ends)
    for key, put_kept, prior in zip(it, it, it, strict=True):
        if put_kept:
            e_added += h(key.encode() + b"\0" + put_kept.to_bytes(8, "little"))
            e_count += 1
        if prior:
            e_removed += h(key.encode() + b"\0" + prior.to_bytes(8, "little"))
            e_count -= 1

    dirty_add = dirty.add
    added = removed = n_added = n_removed = 0
    # ...and each key's last operation, read again from its transaction (decoded once above,
    # so this cannot fail half-way). Nothing is kept per key but its lsn: 10,000 tuples alive
    # here were enough to set off a full garbage collection in the middle of an open.
    first = frames.first_lsn
    span = frames.spans
    owners = frames.owners() if last else []  # frame index -> view of its buffer
    several: dict[int, tuple[Op, ...]] = {}  # transactions of more than one operation
    for key, signed in last.items():
        is_put = signed > 0
        lsn = signed if is_put else -signed
        assert first <= lsn < first + len(frames), "a key's last lsn is one of the frames'"
        ops = several.get(lsn)
        if ops is None:
            at = lsn - first  # lsns are contiguous from the first frame
            ops = decode(owners[at][span[2 * at] : span[2 * at + 1]]).ops
            if len(ops) > 1:
                several[lsn] = ops
        op = ops[0] if len(ops) == 1 else _applied(ops, key)
        # (A transaction naming the key twice can end on a delete after the put that applies.)
        hn = h(key.encode() + b"\0" + lsn.to_bytes(8, "little")) if is_put or op.value is not None else 0
        if is_put:  # the last put on a key: no later prior subtracts it
            e_added += hn
            e_count += 1
        old = records.get(key)
        old_lsn: int | None = None
        old_blobs: tuple[str, ...] = ()
        if old is not None:
            if old.lsn >= lsn:
                continue  # every operation on the key is older than its record file: skipped
            old_lsn, old_blobs = old.lsn, old.blobs
        elif unread:
            entry = unread.get(key)
            if entry is not None:
                if entry.lsn >= lsn:
                    continue
                del unread[key]
                old_lsn, old_blobs = entry.lsn, entry.blobs
        dirty_add(key)
        if old_lsn is not None:
            removed += h(key.encode() + b"\0" + old_lsn.to_bytes(8, "little"))
            n_removed += 1
            if old_blobs:
                blob_refs.subtract(old_blobs)
                for d in old_blobs:
                    if blob_refs[d] <= 0:
                        del blob_refs[d]
        if op.value is not None:
            records[key] = RecordImage(key, lsn, op.value, op.blobs)
            added += hn
            n_added += 1
            if op.blobs:
                blob_refs.update(op.blobs)
        elif old is not None:
            del records[key]
    digest.merge(Digest(added - removed, n_added - n_removed))
    if check.expected is not None:
        check.expected.merge(Digest(e_added - e_removed, e_count))


def _last_ops(frames: LogFrames, last: dict[str, int]) -> list[Any]:
    """Fill ``last`` (key -> lsn of its last operation, negative for a delete) and return,
    flat, ``key, put_kept, prior`` for each place a chain of operations on a key breaks.

    Why so few hashes: on one key, an operation whose prior is the lsn of the put just before
    it subtracts exactly the term that put added, so a sound chain ``put@a, put@b (prior a),
    delete@c (prior b)`` sums to ``-h(first prior)`` and nothing else: the middle terms
    telescope away. Only where the chain breaks do terms stay: the first operation on a key
    (its prior is subtracted), a prior that is not the put just before it (that put stays
    added, ``put_kept``, and the prior is subtracted), a key named twice in one transaction.
    The last put on each key stays added too; the caller hashes it with the record it makes.
    """
    decode = _tx_decoder.decode
    get = last.get
    chain_ends: list[Any] = []  # flat: no tuple per entry for the collector to track
    lsn = frames.first_lsn - 1
    for view, spans in frames.by_run():
        it = iter(spans)
        for start, end in zip(it, it, strict=True):
            lsn += 1
            for op in decode(view[start:end]).ops:
                key = op.key
                prev = get(key)  # the key's previous operation: > 0 a put, < 0 a delete
                last[key] = lsn if op.value is not None else -lsn
                if prev is not None and op.prior == prev > 0 and prev != lsn:
                    continue  # the chain goes on: this prior cancels that put
                put_kept = prev if prev is not None and prev > 0 else 0
                prior = op.prior
                if put_kept and prior == put_kept:
                    put_kept = prior = 0  # same transaction, same key: still cancels
                if put_kept or prior:
                    chain_ends += (key, put_kept, prior)
    return chain_ends


def _applied(ops: tuple[Op, ...], key: str) -> Op:
    """Of a transaction that names ``key`` more than once (no sound log does), the operation
    that leaves it as applying the operations one by one would: a put makes the record that
    lsn's, so later operations on the key in the same transaction are skipped; deletes all
    apply."""
    mine = [op for op in ops if op.key == key]
    return next((op for op in mine if op.value is not None), mine[-1])


def _reproduce_newer(frames: LogFrames, newer: set[tuple[str, int]]) -> None:
    """Strike from ``newer`` each record file ``(key, version)`` that a put in the log
    reproduces (the early writes of an interrupted checkpoint; rare, so only those frames
    are looked at)."""
    first, count = frames.first_lsn, len(frames)
    for key, lsn in list(newer):
        if not 0 <= lsn - first < count:
            continue
        ops = _tx_decoder.decode(frames.payload(lsn - first)).ops
        if any(op.key == key and op.value is not None for op in ops):
            newer.discard((key, lsn))

"""Replay of the log at open: the per-operation pass does no hashing and builds no record.

A log of tens of thousands of transactions over a few thousand keys overwrites most keys
many times, and what replay must produce depends only on each key's last operation:

* **State.** Log lsns only grow, so a key's last operation is its newest; it applies exactly
  when it is newer than the key's version before replay (the record file or catalog entry),
  and then every earlier operation on the key applied too. One record image is built per
  key, from its last after-image (``RecordImage`` for the earlier ones would be dropped).
  The pass over the log keeps only each key's last lsn (a plain int: holding each key's
  decoded operation kept ~10 MiB of values alive and cost more than decoding the ~10,000
  final transactions a second time at the end).
* **The MANIFEST's digest carried forward** (``ReplayCheck``): every operation subtracts the
  hash of ``(key, prior)`` and every put adds the hash of ``(key, lsn)``. When an operation's
  prior is the version the key's previous put wrote (what a sound log always holds), the
  two terms cancel, so neither is hashed; a prior that does not match is hashed as it is,
  so the sum, and hence what :meth:`ReplayCheck.finish` decides, is unchanged.
* **The state's own digest**: the versions replaced in between cancel the same way; what
  remains is minus each replaced pre-replay version plus each key's final version.

Sums are modulo 2**128 and commute, so the digests equal the step-by-step path's
(``ReplayCheck.op`` then ``CommittedState.apply`` per operation, which watchers still get,
and which ``tests/unit/test_store_replay_fused.py`` compares this with).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec
import xxhash

from ..wal.frame import Frame
from ..wal.frames import LogFrames
from . import native
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
    """Bring a ``CommittedState``'s parts (it has no watchers) through ``frames``, in
    increasing lsn order, carrying ``check`` along; nothing changes if a transaction cannot
    be decoded."""
    h = xxhash.xxh3_128_intdigest
    decode = _tx_decoder.decode
    # Payloads are decoded straight from the segment images (spans, no copies).
    frames = frames if isinstance(frames, LogFrames) else LogFrames.from_frames(frames)
    # key -> lsn of its last operation so far: positive for a put (whose hash is owed to the
    # MANIFEST's digest until the next operation on the key cancels it or not), negative for
    # a delete.
    last: dict[str, int] = {}
    e_added = e_removed = e_count = 0  # the MANIFEST's digest: terms that did not cancel
    try:
        if check.newer:
            _reproduce_newer(frames, check.newer)
        fast = native.fast_first_pass
        odd = fast(list(frames.by_run()), frames.first_lsn, last) if fast is not None else None
        if odd is None:  # no C pass, or a log it does not read: msgspec decides
            last.clear()
            odd = _first_pass(frames, last)
    except msgspec.DecodeError as exc:
        raise StoreCorruptError(f"undecodable transaction: {exc}") from None
    it = iter(odd)
    for key, owed, prior in zip(it, it, it, strict=True):
        if owed:
            e_added += h(key.encode() + b"\0" + owed.to_bytes(8, "little"))
            e_count += 1
        if prior:
            e_removed += h(key.encode() + b"\0" + prior.to_bytes(8, "little"))
            e_count -= 1

    dirty_add = dirty.add
    added = removed = n_added = n_removed = 0
    # Each key's last operation, read again from its transaction (decoded once above, so
    # this cannot fail half-way). Nothing is kept per key but its lsn: 10,000 tuples alive
    # here were enough to set off a full garbage collection in the middle of an open.
    first = frames.first_lsn
    span = frames.spans
    owners = frames.owners() if last else []  # frame index -> view of its buffer
    several: dict[int, tuple[Op, ...]] = {}  # transactions of more than one operation
    for key, signed in last.items():
        owed = signed > 0
        lsn = signed if owed else -signed
        ops = several.get(lsn)
        if ops is None:
            at = lsn - first  # lsns are contiguous from the first frame
            ops = decode(owners[at][span[2 * at] : span[2 * at + 1]]).ops
            if len(ops) > 1:
                several[lsn] = ops
        op = ops[0] if len(ops) == 1 else _applied(ops, key)
        hn = 0
        if op.value is not None or owed:
            hn = h(key.encode() + b"\0" + lsn.to_bytes(8, "little"))
        if owed:
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


def _first_pass(frames: LogFrames, last: dict[str, int]) -> list[Any]:
    """Fill ``last`` (key -> lsn of its last operation, negative for a delete) and return,
    flat, ``key, owed, prior`` for each operation whose prior is not the put just before it
    on the key: ``owed`` the previous put's lsn whose hash no prior cancelled (else 0),
    ``prior`` the prior to subtract (else 0). What a sound log holds costs nothing here."""
    decode = _tx_decoder.decode
    get = last.get
    odd: list[Any] = []
    lsn = frames.first_lsn - 1
    for view, spans in frames.by_run():
        it = iter(spans)
        for start, end in zip(it, it, strict=True):
            lsn += 1
            for op in decode(view[start:end]).ops:
                key = op.key
                prev = get(key)
                last[key] = lsn if op.value is not None else -lsn
                if prev is not None and op.prior == prev > 0 and prev != lsn:
                    continue  # what a sound log holds: the prior is the put just before
                # Everything else: the first operation on a key, a prior that does not match,
                # a key named twice in one transaction.
                prior = op.prior
                owed = 0
                if prev is not None and prev > 0:
                    if prior == prev:
                        prior = 0  # cancels the owed hash: neither is hashed
                    else:
                        owed = prev
                if owed or prior:
                    odd += (key, owed, prior)
    return odd


def _applied(ops: tuple[Op, ...], key: str) -> Op:
    """Of a transaction that names ``key`` more than once (no sound log does), the
    operation that leaves it as step-by-step replay would: a put makes the record that lsn's,
    so later operations on the key in the same transaction are skipped; deletes all apply."""
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

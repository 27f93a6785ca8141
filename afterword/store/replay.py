"""Replay of the log at open: the per-operation pass does no hashing and builds no record.

A log of tens of thousands of transactions over a few thousand keys overwrites most keys
many times, and what replay must produce depends only on each key's last operation:

* **State.** Log lsns only grow, so a key's last operation is its newest; it applies exactly
  when it is newer than the key's version before replay (the record file or catalog entry),
  and then every earlier operation on the key applied too. One record image is built per
  key, from its last after-image (``RecordImage`` for the earlier ones would be dropped).
* **The MANIFEST's digest carried forward** (``ReplayCheck``): every operation subtracts the
  hash of ``(key, prior)`` and every put adds the hash of ``(key, lsn)``. When an operation's
  prior is the version the key's previous put wrote (what a sound log always holds), the
  two terms cancel, so neither is hashed; a prior that does not match is hashed as it is,
  so the sum, and hence what :meth:`ReplayCheck.finish` decides, is unchanged.
* **The state's own digest**: the versions replaced in between cancel the same way; what
  remains is minus each replaced pre-replay version plus each key's final version.

Sums are modulo 2**128 and commute, so the digests equal the step-by-step path's
(``ReplayCheck.op`` then ``CommittedState.apply`` per operation, which watchers still get,
and which ``tests/test_store_replay_fused.py`` compares this with).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import msgspec
import xxhash

from ..wal.frame import Frame
from .catalog import CatalogEntry
from .codec import Op, RecordImage, _tx_decoder
from .errors import StoreCorruptError
from .evidence import Digest, ReplayCheck


def replay_last_images(
    frames: Iterable[Frame],
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
    newer = check.newer
    # key -> (lsn, op) of its last operation so far. A put's hash is owed to the MANIFEST's
    # digest until the next operation on the key either cancels it (prior == that lsn) or not.
    last: dict[str, tuple[int, Op]] = {}
    # Rare (a sound log names a key once per transaction): a put followed by more operations
    # on its key in the same transaction. Those are skipped (the record is already at that
    # lsn), so the first put is what applies.
    first_put: dict[str, tuple[int, Op]] = {}
    e_added = e_removed = n_puts = n_priors = 0
    try:
        for _offset, lsn, _batch, payload, _end in frames:
            for op in decode(payload).ops:
                key, prior = op.key, op.prior
                prev = last.get(key)
                if prev is not None:
                    prev_lsn, prev_op = prev
                    if prev_op.value is not None:
                        if prior == prev_lsn:
                            prior = 0  # cancels the owed hash: neither is hashed
                            n_priors += 1
                        else:
                            e_added += h(key.encode() + b"\0" + prev_lsn.to_bytes(8, "little"))
                        if prev_lsn == lsn:
                            seen = first_put.get(key)
                            if seen is None or seen[0] != lsn:
                                first_put[key] = prev
                if prior:
                    e_removed += h(key.encode() + b"\0" + prior.to_bytes(8, "little"))
                    n_priors += 1
                if op.value is not None:
                    n_puts += 1
                    if newer:
                        newer.discard((key, lsn))
                last[key] = (lsn, op)
    except msgspec.DecodeError as exc:
        raise StoreCorruptError(f"undecodable transaction: {exc}") from None

    dirty_add = dirty.add
    added = removed = n_added = n_removed = 0
    for key, (lsn, op) in last.items():
        hn = 0
        if op.value is not None:
            hn = h(key.encode() + b"\0" + lsn.to_bytes(8, "little"))
            e_added += hn
        if first_put:
            seen = first_put.get(key)
            if seen is not None and seen[0] == lsn:
                op = seen[1]
                hn = h(key.encode() + b"\0" + lsn.to_bytes(8, "little"))
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
        check.expected.merge(Digest(e_added - e_removed, n_puts - n_priors))


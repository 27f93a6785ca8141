"""Maintenance: recovery at startup, parking a record the store can no longer take, and
retention (compaction to tombstones, dropping old tombstones, sweeping unreferenced blobs)."""

from __future__ import annotations

import logging

from ..blobs import BlobStore
from ..config import Config
from ..continuations import lifecycle
from ..continuations.actions import after_restart
from ..continuations.model import Continuation, encode
from ..continuations.retention import compactable, plan_retention, retention_limits, tombstone_of
from ..store import Delete, Mutation, Put, RecordTooLarge
from ..wal import TransactionTooLarge
from .ledger import RECORD_SLACK, SETTLE_BATCH, Ledger
from .repository import LIVE, TOMB, bounded_batches

log = logging.getLogger("afterword.service")

RETENTION_BATCH = 200
TOO_LARGE = (RecordTooLarge, TransactionTooLarge)


class Maintenance:
    def __init__(self, config: Config, ledger: Ledger, blobs: BlobStore, payloads: BlobStore) -> None:
        self.config = config
        self.ledger = ledger
        self.repo = ledger.repo
        self.store = ledger.store
        self.blobs = blobs
        self.payloads = payloads

    # -- recovery ----------------------------------------------------------------------------
    def recovered(self, rec: Continuation, now: int) -> Continuation:
        """What recovery makes of one record; the decision is the core's
        (:func:`afterword.continuations.actions.after_restart`), this only looks up the
        record's group activation marker."""
        marker = self.repo.activation(rec.claim.run_id or "") if rec.claim.kind == "interactive" else None
        return after_restart(rec, None if marker is None else marker.claim_ids, now)

    async def recover(self) -> int:
        """Finish what a stop interrupted: settle origins, and turn interrupted synthesis or
        delivery into a non-replayed terminal state. Returns the number of records changed.

        Commits in batches bounded by bytes; a record whose new version the store refuses is
        parked (see :meth:`park_unwritable`) so that startup always completes."""
        now = self.ledger.clock_ms()
        changes: dict[str, tuple[Continuation, Continuation]] = {}
        for rec in self.repo.live():
            new = self.recovered(rec, now)
            if new != rec:
                changes[rec.id] = (rec, new)

        def size(cid: str) -> int:
            return len(encode(changes[cid][1])) + RECORD_SLACK

        for batch in bounded_batches(list(changes), size, self.ledger.tx_budget, SETTLE_BATCH):
            pairs = [changes[cid] for cid in batch]
            try:
                await self.ledger.commit(pairs)
            except TOO_LARGE:
                for pair in pairs:
                    try:
                        await self.ledger.commit([pair])
                    except TOO_LARGE:
                        await self.park_unwritable(pair[0], now)
        if changes:
            log.info("recovery changed %d continuation(s)", len(changes))
        return len(changes)

    async def park_unwritable(self, rec: Continuation, now: int) -> None:
        """A record whose next version does not fit the store: end it where an operator sees
        it (dead-lettered, or delivery_unknown if posting may have begun), dropping its
        synthesized text to make room. If even that cannot be written, it is left as it was
        (health lists it) and startup carries on."""
        parked = lifecycle.park(
            rec, "record_too_large", "the record outgrew the store's per-record limit", now
        )
        try:
            await self.ledger.commit([(rec, parked)])
            log.error("continuation %s parked: its next version exceeds the store's limits", rec.id)
        except TOO_LARGE:
            log.error("continuation %s could not be changed (too large); left for an operator", rec.id)

    # -- retention ---------------------------------------------------------------------------
    async def apply_retention(self) -> tuple[int, int, int]:
        """Compact settled records, drop expired tombstones, sweep unreferenced blobs.

        Applied in bounded batches, each one transaction, so a crash leaves a prefix of the
        plan done and the next pass finishes it. Returns (compacted, dropped, blobs swept).
        """
        plan = plan_retention(
            self.repo.live(),
            self.repo.tombstone_summaries(),  # planned from summaries: no tombstone file is read
            self.ledger.clock_ms(),
            retention_limits(self.config.retention),
        )
        dropped_set = set(plan.drop)
        compacted = dropped = 0
        # A tombstone is never larger than its record, so the stored sizes bound each batch.
        present = [cid for cid in plan.compact if self.store.get(LIVE + cid) is not None]
        for batch in bounded_batches(
            present, self.ledger.stored_size, self.ledger.tx_budget, RETENTION_BATCH
        ):
            async with self.ledger.locked(batch):
                mutations: list[Mutation] = []
                expect: dict[str, int | None] = {}
                for cid in batch:
                    rec = self.repo.get(cid)
                    if rec is None or not compactable(rec):
                        continue  # changed since planning: judged again next pass
                    mutations.append(Delete(LIVE + cid))
                    expect[LIVE + cid] = self.repo.version(cid)
                    if cid not in dropped_set:
                        mutations.append(Put(TOMB + cid, encode(tombstone_of(rec))))
                if mutations:
                    await self.store.transact(mutations, expect=expect)
                    compacted += sum(1 for m in mutations if isinstance(m, Delete))
        for i in range(0, len(plan.drop), RETENTION_BATCH):
            batch = [cid for cid in plan.drop[i : i + RETENTION_BATCH] if self.repo.has_tombstone(cid)]
            if batch:
                await self.store.transact([Delete(TOMB + cid) for cid in batch])
                dropped += len(batch)
        # On the loop thread: the referenced set and the sweep must see the same moment, or a
        # blob committed (and unpinned) in between could be judged unreferenced.
        referenced = self.store.referenced_blobs()
        swept = self.blobs.sweep(referenced) + self.payloads.sweep(referenced)
        if compacted or dropped or swept:
            log.info(
                "retention: %d compacted, %d tombstones dropped, %d blobs swept",
                compacted,
                dropped,
                len(swept),
            )
        return compacted, dropped, len(swept)

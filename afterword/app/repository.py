"""Typed continuation records over the record store, with in-memory indexes.

Keys: ``c/<id>`` live continuations, ``t/<id>`` compacted tombstones, ``a/<run digest>``
group activation markers. Indexes (kept current by a store watcher, so replay and live
commits update them the same way): counts by state, active counts by origin, keyset order
``(created_at_ms, id)`` for operator pages, and the set of ids the worker may act on.

Live continuations are all decoded in memory. Tombstones are indexed by their summaries
(``afterword.app.tombstones``) and read from their files only when one is asked for.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable

import blake3

from ..continuations.errors import ContinuationError
from ..continuations.health import ACTIVE
from ..continuations.keyspace import ACTIVATION as ACTIVATION
from ..continuations.keyspace import LIVE as LIVE
from ..continuations.keyspace import TOMB as TOMB
from ..continuations.keyspace import bounded_batches as bounded_batches
from ..continuations.model import (
    Activation,
    Continuation,
    Tombstone,
    TombstoneSummary,
    decode_activation,
    encode,
)
from ..store import Collection, Put, RecordStore, StoreCorruptError
from .tombstones import Tombstones

__all__ = [
    "ACTIVATION",
    "LIVE",
    "TOMB",
    "IndexCorrupt",
    "Repository",
    "activation_key",
    "bounded_batches",
    "origin_key",
    "referenced_blobs",
]


class IndexCorrupt(ContinuationError, StoreCorruptError):
    key: str = ""  # the record that could not be indexed (shown by health)
    rule: str = ""  # for a record file the store refused at its first read: the store's rule

    """A stored continuation record could not be indexed: the in-memory index no longer
    matches durable state, so every use of the repository fails closed until the state
    directory is inspected and reopened."""

    status = 500
    code = "state_corrupt"


def referenced_blobs(rec: Continuation) -> tuple[str, ...]:
    """The blobs a record pins: its origin snapshot and an out-of-line result payload."""
    refs: tuple[str, ...] = (rec.snapshot_digest,) if rec.snapshot_digest else ()
    if rec.result is not None and rec.result.payload_digest is not None:
        refs = (*refs, rec.result.payload_digest)
    return refs


def origin_key(rec: Continuation) -> str:
    c = rec.claim
    if c.kind == "detached":
        return f"detached\x00{c.server_name}\x00{c.route}"
    return f"run\x00{c.run_id}\x00{c.conversation_id}"


def activation_key(run_id: str) -> str:
    return ACTIVATION + blake3.blake3(run_id.encode()).hexdigest()[:48]


def _index_corrupt(key: str, message: str, rule: str = "") -> IndexCorrupt:
    err = IndexCorrupt(f"continuation record cannot be indexed: {message}")
    err.key = key
    err.rule = rule
    return err


class Repository:
    """Continuations (``c/``) and tombstones (``t/``) as two collections
    (:class:`afterword.store.Collection`), with the indexes the service and the operator
    pages read.

    A record that cannot be decoded or indexed raises :class:`IndexCorrupt` from the
    constructor (the service does not open over it) or, once committed live, from every
    later read (the collections fail closed). A tombstone known only by its summary is
    checked when it is first read: a damaged one raises :class:`IndexCorrupt` then, and every
    later read too.
    """

    def __init__(self, store: RecordStore) -> None:
        self.store = store
        self._state_counts: Counter[str] = Counter()
        self._origin_active: Counter[str] = Counter()
        self._history_unrecorded = 0
        # Keyset order of every record, built at the first page (sorting 60,000 pairs was a
        # large part of a start) and kept current from then on.
        self._order: list[tuple[int, str]] | None = None
        self._live = Collection(
            store, LIVE, Continuation, on_change=self._on_live, blobs=referenced_blobs, error=_index_corrupt
        )
        self._tombs = Tombstones(store, TOMB, self._on_tomb, _index_corrupt, self._load_tombs)
        # Writers of one continuation take its lock from this pool (in sorted order).
        self.locks = self._live.locks

    def check(self) -> None:
        """Raise :class:`IndexCorrupt` once a committed record could not be indexed."""
        self._live.check()
        self._tombs.check()

    # -- index maintenance -------------------------------------------------------------------
    def _account(self, rec: Continuation, sign: int) -> None:
        self._state_counts[rec.state] += sign
        if rec.state in ACTIVE:
            self._origin_active[origin_key(rec)] += sign
        if rec.state == "delivered" and rec.receipt is not None and not rec.receipt.history_recorded:
            self._history_unrecorded += sign

    def _on_live(self, cid: str, prev: Continuation | None, rec: Continuation | None) -> None:
        if prev is not None:
            self._account(prev, -1)
            if rec is None:
                self._remove_order(prev)
        if rec is not None:
            self._account(rec, +1)
            if prev is None:
                self._order_add(rec.claim.created_at_ms, cid)

    def _on_tomb(self, cid: str, prev: TombstoneSummary | None, tomb: TombstoneSummary | None) -> None:
        if prev is not None:
            self._state_counts[prev.state] -= 1
            if tomb is None and cid not in self._live:
                self._order_remove(prev.created_at_ms, cid)
        if tomb is not None:
            self._state_counts[tomb.state] += 1
            if prev is None and cid not in self._live:
                self._order_add(tomb.created_at_ms, cid)

    def _load_tombs(self, summaries: list[TombstoneSummary]) -> None:
        """``_on_tomb(id, None, summary)`` for each, in bulk (construction only)."""
        self._state_counts.update(s.state for s in summaries)

    def _remove_order(self, rec: Continuation) -> None:
        if rec.id not in self._tombs:
            self._order_remove(rec.claim.created_at_ms, rec.id)

    def _order_add(self, created: int, cid: str) -> None:
        if self._order is not None:
            bisect.insort(self._order, (created, cid))

    def _order_remove(self, created: int, cid: str) -> None:
        order = self._ordered()
        if order is None:
            return
        i = bisect.bisect_left(order, (created, cid))
        if i < len(order) and order[i] == (created, cid):
            del order[i]

    def _ordered(self) -> list[tuple[int, str]]:
        if self._order is None:
            order = [(rec.claim.created_at_ms, cid) for cid, rec in self._live.items()]
            live = {cid for _, cid in order}
            order += [(s.created_at_ms, s.id) for s in self._tombs.summaries() if s.id not in live]
            order.sort()
            self._order = order
        return self._order

    # -- reads -------------------------------------------------------------------------------
    @property
    def state_counts(self) -> Counter[str]:
        self.check()
        return self._state_counts

    @property
    def origin_active(self) -> Counter[str]:
        self.check()
        return self._origin_active

    @property
    def history_unrecorded(self) -> int:
        self.check()
        return self._history_unrecorded

    def get(self, cid: str) -> Continuation | None:
        self.check()
        return self._live.get(cid)

    def tombstone(self, cid: str) -> Tombstone | None:
        self.check()
        return self._tombs.get(cid)

    def tombstones(self) -> Iterable[Tombstone]:
        """Every tombstone, read from its file where no read has needed it yet (tools and
        tests; the service's own paths read :meth:`tombstone_summaries`)."""
        self.check()
        return self._tombs.values()

    def tombstone_summaries(self) -> list[TombstoneSummary]:
        """What health and retention read of every tombstone, without reading one."""
        self.check()
        return self._tombs.summaries()

    @property
    def tombstones_unsummarized(self) -> int:
        """Tombstones the open had to read because the catalog held no summary of them."""
        return self._tombs.read_unsummarized

    def has_tombstone(self, cid: str) -> bool:
        self.check()
        return cid in self._tombs

    def version(self, cid: str) -> int | None:
        self.check()
        return self._live.version(cid)

    def live(self) -> Iterable[Continuation]:
        self.check()
        return self._live.values()

    @property
    def active_total(self) -> int:
        self.check()
        return sum(self._state_counts[s] for s in ACTIVE)

    def activation(self, run_id: str) -> Activation | None:
        self.check()
        rec = self.store.get(activation_key(run_id))
        return decode_activation(rec.value) if rec is not None else None

    def page(
        self,
        after: tuple[int, str] | None,
        limit: int,
        *,
        keep: Callable[[Continuation | TombstoneSummary], bool] | None = None,
        newest_first: bool = False,
    ) -> tuple[list[Continuation | Tombstone], bool]:
        """Up to ``limit`` records past the keyset position (in the order asked for) that
        ``keep`` accepts, and whether another such record remains. ``keep`` sees a live
        record or a tombstone's summary; only the tombstones returned are read."""
        self.check()
        order = self._ordered()
        if newest_first:
            i, step = (len(order) if after is None else bisect.bisect_left(order, after)) - 1, -1
        else:
            i, step = (0 if after is None else bisect.bisect_right(order, after)), 1
        out: list[Continuation | Tombstone] = []
        while 0 <= i < len(order):
            cid = order[i][1]
            found: Continuation | TombstoneSummary | None = self._live.get(cid) or self._tombs.summary(cid)
            if found is not None and (keep is None or keep(found)):
                if len(out) == limit:
                    return out, True
                item = found if isinstance(found, Continuation) else self._tombs.get(cid)
                if item is not None:
                    out.append(item)
            i += step
        return out, False

    # -- writes ------------------------------------------------------------------------------
    def put(self, rec: Continuation) -> Put:
        return self._live.put(rec.id, rec)

    @staticmethod
    def activation_put(run_id: str, marker: Activation) -> Put:
        return Put(activation_key(run_id), encode(marker))

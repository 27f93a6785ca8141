"""Tombstones known by their summaries, read from their record files only when asked for.

A service keeps up to ``terminal_max_records`` (50,000 by default) tombstones for idempotent
retries, operator pages and retention, but at start and for its indexes it needs only a few
facts of each (:class:`~afterword.continuations.model.TombstoneSummary`). The store keeps
every catalogued tombstone's summary in its checkpoint catalog, so an open hands those over
without reading 50,000 files (``docs/performance.md``, "Store open"). A tombstone committed
since the checkpoint is in memory and summarized when it is committed.

Fail closed as before, at the first read instead of at start: a tombstone whose file is
damaged (garbled, rolled back, made a symlink or world-readable, ...), that does not decode,
or whose content does not match its summary, raises :class:`IndexCorrupt` naming the record
and the rule the store applied; from then on every use of the repository raises it, as for
a record that could not be indexed, until the state directory is inspected and reopened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import msgspec

from ..continuations.model import Tombstone, TombstoneSummary, decode_tombstone
from ..continuations.summary import SUMMARY_TAG, decode_summaries, encode_summary, summarize
from ..errors import AfterwordError, StateError
from ..store import Record, RecordStore, Summarizer

log = logging.getLogger("afterword.service")

ErrorFactory = Callable[[str, str, str], Exception]  # (key, message, rule)
TombChange = Callable[[str, TombstoneSummary | None, TombstoneSummary | None], None]


def _summary_of(value: bytes) -> bytes:
    return encode_summary(summarize(decode_tombstone(value)))


SUMMARIZER = Summarizer(SUMMARY_TAG, _summary_of)


class Tombstones:
    """The tombstones under ``prefix``: every summary in memory, each tombstone on demand.

    ``on_change(id, old, new)`` is told every change of a summary (and each summary found at
    construction as ``(id, None, summary)``). ``error(key, message, rule)`` builds the error
    a damaged or inconsistent tombstone raises (``rule``: the store's, for a file refused).
    ``on_load(summaries)``, if given, is told the catalogued summaries found at construction
    in one call instead of one ``on_change`` each.
    """

    def __init__(
        self,
        store: RecordStore,
        prefix: str,
        on_change: TombChange,
        error: ErrorFactory,
        on_load: Callable[[list[TombstoneSummary]], None] | None = None,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self._on_change = on_change
        self._error = error
        self._summaries: dict[str, TombstoneSummary] = {}
        self._corrupt: Exception | None = None
        self._loading = True
        unread = store.statistics().unread
        found = store.watch(prefix, self._watch, SUMMARIZER)
        # Catalogued tombstones without a usable summary (a catalog an older version or a tool
        # wrote) were read just now; a checkpoint records their summaries for the next open.
        self.read_unsummarized = unread - store.statistics().unread
        summaries = self._decode_all(found)
        if on_load is None:
            for summary in summaries:
                self._set(self.prefix + summary.id, summary)
        else:
            # In bulk: tens of thousands of summaries, two Python calls each, were most of
            # a start's index building.
            fresh = [s for s in summaries if s.id not in self._summaries]
            self._summaries.update((s.id, s) for s in fresh)
            on_load(fresh)
        self._loading = False

    def _decode_all(self, found: list[tuple[str, bytes]]) -> list[TombstoneSummary]:
        """Every catalogued summary, decoded by one call over a msgpack array of them."""
        if not found:
            return []
        body = b"".join(data for _, data in found)
        try:
            summaries = decode_summaries(len(found), body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise self._error(
                self.prefix, f"the catalog's tombstone summaries do not decode: {exc}", ""
            ) from None
        n = len(self.prefix)
        for (key, _), summary in zip(found, summaries, strict=True):
            if key[n:] != summary.id:  # also catches a summary that parsed across its neighbour
                raise self._error(key, f"the catalog's summary of {key!r} names {summary.id!r}", "")
        return summaries

    # -- following the store -------------------------------------------------------------------
    def _set(self, key: str, summary: TombstoneSummary | None) -> None:
        cid = key[len(self.prefix) :]
        if summary is not None and summary.id != cid:
            raise self._error(key, f"tombstone {key!r} holds the claim of {summary.id!r}", "")
        before = self._summaries.get(cid)
        if summary is None:
            if before is None:
                return
            del self._summaries[cid]
        else:
            self._summaries[cid] = summary
        self._on_change(cid, before, summary)

    def _watch(self, key: str, old: Record | None, new: Record | None) -> None:
        if self._corrupt is not None:
            return  # already refusing every use
        try:
            self._set(key, summarize(decode_tombstone(new.value)) if new is not None else None)
        except Exception as exc:
            if isinstance(exc, msgspec.DecodeError | msgspec.ValidationError):
                err = self._error(key, f"record {key!r} does not decode as Tombstone: {exc}", "")
            elif isinstance(exc, AfterwordError):
                err = exc
            else:
                err = self._error(key, f"record {key!r} cannot be indexed: {type(exc).__name__}: {exc}", "")
            if self._loading:
                raise err from None
            log.error("tombstones: %s", err)
            self._corrupt = err

    def check(self) -> None:
        if self._corrupt is not None:
            raise self._corrupt

    # -- reading -------------------------------------------------------------------------------
    def __contains__(self, cid: object) -> bool:
        self.check()
        return cid in self._summaries

    def __len__(self) -> int:
        self.check()
        return len(self._summaries)

    def summary(self, cid: str) -> TombstoneSummary | None:
        self.check()
        return self._summaries.get(cid)

    def summaries(self) -> list[TombstoneSummary]:
        self.check()
        return list(self._summaries.values())

    def get(self, cid: str) -> Tombstone | None:
        """The whole tombstone, read from its record file if no read has needed it yet."""
        self.check()
        summary = self._summaries.get(cid)
        if summary is None:
            return None
        key = self.prefix + cid
        try:
            rec = self.store.get(key)
        except StateError as exc:
            # The store's own refusal (its rule: record_digest, permissive_mode, symlink, ...).
            rule = str(getattr(exc, "rule", "corrupt"))
            log.error("tombstones: %s cannot be read: %s", key, exc)
            self._corrupt = self._error(
                key,
                f"tombstone {key!r} cannot be read ({rule}): stop the service and run "
                "`afterword continuations doctor`",
                rule,
            )
            raise self._corrupt from exc
        try:
            if rec is None:
                raise ValueError("indexed but not stored")
            tomb = decode_tombstone(rec.value)
            if summarize(tomb) != summary:
                raise ValueError("does not match its catalogued summary")
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            self._corrupt = self._error(
                key, f"tombstone {key!r} cannot be indexed: {exc}", "record_undecodable"
            )
            raise self._corrupt from None
        return tomb

    def values(self) -> Iterator[Tombstone]:
        """Every tombstone, each read as :meth:`get` reads it (tools and tests; the service
        reads summaries)."""
        for cid in list(self._summaries):
            tomb = self.get(cid)
            if tomb is not None:
                yield tomb

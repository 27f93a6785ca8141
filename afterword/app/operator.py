"""Operator verbs: list (with a MAC'd cursor), show, captured text, retry, cancel,
acknowledge and resolve (docs/design.md, Contracts: app handle)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..config import Config
from ..continuations import lifecycle
from ..continuations.errors import Compacted, InvalidRequest, NotFound
from ..continuations.model import STATES, Continuation, Tombstone, TombstoneSummary, encode
from ..protocol.views import detail_body, list_item, status_body
from ..protocol.wire import DetailBody, ListResponse, StatusBody
from ..store import Put
from .ledger import Ledger
from .ports import HistoryRecorder, Transition
from .repository import TOMB

log = logging.getLogger("afterword.service")

ResolutionKind = Literal["delivered", "not_delivered", "dead_lettered"]


@dataclass(frozen=True)
class Resolution:
    kind: ResolutionKind
    delivery_id: str | None = None


def encode_cursor(key: bytes, position: tuple[int, str]) -> str:
    """An opaque page cursor: the keyset position, with a MAC so a client cannot forge one."""
    body = base64.urlsafe_b64encode(f"{position[0]}:{position[1]}".encode()).decode().rstrip("=")
    mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:32]
    return f"{body}.{mac}"


def decode_cursor(key: bytes, cursor: str) -> tuple[int, str]:
    body, sep, mac = cursor.partition(".")
    expected = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:32]
    if not sep or not hmac.compare_digest(expected.encode(), mac.encode()):
        raise InvalidRequest("invalid cursor")
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
        created, cid = raw.split(":", 1)
        return int(created), cid
    except ValueError:
        raise InvalidRequest("invalid cursor") from None


def as_resolution(resolution: Resolution | Mapping[str, Any]) -> Resolution:
    if not isinstance(resolution, Mapping):
        return resolution
    kind = resolution.get("kind")
    if kind == "delivered" or kind == "not_delivered" or kind == "dead_lettered":
        return Resolution(
            kind=kind, delivery_id=resolution.get("deliveryId") or resolution.get("delivery_id")
        )
    raise InvalidRequest("resolution kind must be delivered, not_delivered or dead_lettered")


class Operator:
    def __init__(self, config: Config, ledger: Ledger, cursor_key: bytes) -> None:
        self.config = config
        self.ledger = ledger
        self.repo = ledger.repo
        self.cursor_key = cursor_key
        # Appends an operator-confirmed delivery to the conversation history; registered by
        # whoever owns the history (the worker, through ContinuationService.register_worker).
        # Without one (a service no worker runs for) the bare verdict is all that is stored.
        self.recorder: HistoryRecorder | None = None

    def list_continuations(
        self,
        limit: int | None = None,
        cursor: str | None = None,
        *,
        state: str | None = None,
        server: str | None = None,
        route: str | None = None,
        newest_first: bool = False,
    ) -> ListResponse:
        """One keyset page, oldest first unless ``newest_first``; ``state``, ``server`` and
        ``route`` keep only records with exactly that value. A cursor is a position in the
        order: pass the same filters and order with it."""
        page_size = self.config.limits.operator_page_size
        if limit is None:
            limit = page_size
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidRequest("limit must be a positive integer")
        if limit > page_size:
            raise InvalidRequest(f"limit may not exceed the configured page size {page_size}")
        if state is not None and state not in STATES:
            raise InvalidRequest("state must be one of " + ", ".join(STATES))
        after = decode_cursor(self.cursor_key, cursor) if cursor else None

        def keep(rec: Continuation | TombstoneSummary) -> bool:
            # A tombstone is filtered by its summary, so a filtered page reads only the
            # tombstones it returns.
            names = rec.claim if isinstance(rec, Continuation) else rec
            return (
                (state is None or rec.state == state)
                and (server is None or names.server_name == server)
                and (route is None or names.route == route)
            )

        filtered = state is not None or server is not None or route is not None
        items, more = self.repo.page(after, limit, keep=keep if filtered else None, newest_first=newest_first)
        next_cursor = None
        if more and items:
            last = items[-1]
            next_cursor = encode_cursor(self.cursor_key, (last.claim.created_at_ms, last.claim.id))
        return ListResponse(items=[list_item(i) for i in items], next_cursor=next_cursor)

    def continuation_detail(self, cid: str) -> DetailBody:
        """One record for ``afterword continuations show``: status, binding names, history."""
        rec: Continuation | Tombstone | None = self.repo.get(cid) or self.repo.tombstone(cid)
        if rec is None:
            raise NotFound(f"no continuation {cid}")
        return detail_body(rec)

    def captured_continuation_text(self, cid: str) -> str | None:
        """The retained text of a delivered capture continuation; None for anything else."""
        rec = self.repo.get(cid)
        if rec is None:
            if self.repo.tombstone(cid) is None:
                raise NotFound(f"no continuation {cid}")
            return None
        if rec.claim.mode != "capture" or rec.state != "delivered":
            return None
        return rec.text

    async def _live_transition(self, cid: str, done: str, fn: Transition) -> Continuation:
        """Apply an operator verb to the live record ``cid``. A record retention compacted
        (before the call or while it waited for the record's lock) is refused as compacted,
        not as unknown: ``show`` still finds it."""
        try:
            rec, _ = await self.ledger.transition(cid, fn)
        except NotFound:
            tomb = self.repo.tombstone(cid)
            if tomb is None:
                raise
            raise Compacted(cid, tomb.state, done) from None
        return rec

    async def retry_continuation(self, cid: str, allow_unknown: bool = False) -> StatusBody:
        now = self.ledger.clock_ms()
        rec = await self._live_transition(
            cid, "retried", lambda r: lifecycle.retry(r, allow_unknown=allow_unknown, now_ms=now)
        )
        log.info("continuation %s retried by operator", cid)
        return status_body(rec)

    async def cancel_continuation(self, cid: str) -> StatusBody:
        now = self.ledger.clock_ms()
        if self.repo.get(cid) is None and (tomb := self.repo.tombstone(cid)) is not None:
            if tomb.state == "cancelled":
                return status_body(tomb)  # idempotent, compacted or not
            raise Compacted(cid, tomb.state, "cancelled")
        rec = await self._live_transition(cid, "cancelled", lambda r: lifecycle.cancel(r, now))
        return status_body(rec)

    async def acknowledge_continuation(self, cid: str) -> StatusBody:
        """Record durably that an operator has seen a dead letter, an expiry or a delivery
        missing from history: it stops affecting health and becomes subject to retention.
        Idempotent; an unknown delivery must be resolved instead, active work cancelled."""
        now = self.ledger.clock_ms()
        async with self.ledger.locked([cid]):
            rec = self.repo.get(cid)
            if rec is None:
                tomb = self.repo.tombstone(cid)
                if tomb is None:
                    raise NotFound(f"no continuation {cid}")
                acked = lifecycle.acknowledge_tombstone(tomb, now)
                if acked is None:
                    return status_body(tomb)
                key = TOMB + cid
                store = self.ledger.store
                await store.transact([Put(key, encode(acked))], expect={key: store.latest_version(key)})
                log.info("continuation %s acknowledged by operator", cid)
                return status_body(acked)
            new = lifecycle.acknowledge(rec, now)
            if new is None:
                return status_body(rec)
            await self.ledger.commit([(rec, new)])
        log.info("continuation %s acknowledged by operator", cid)
        return status_body(new)

    async def resolve_continuation_delivery(
        self, cid: str, resolution: Resolution | Mapping[str, Any]
    ) -> StatusBody:
        res = as_resolution(resolution)
        now = self.ledger.clock_ms()
        rec = await self._live_transition(
            cid, "resolved", lambda r: lifecycle.resolve(r, res.kind, res.delivery_id, now)
        )
        if res.kind == "delivered" and self.recorder is not None:
            # History-only commit: the operator verified the post; nothing is posted again.
            recorded, code = await self.recorder.record_history(rec)
            later = self.ledger.clock_ms()
            rec, _ = await self.ledger.transition(
                cid, lambda r: lifecycle.with_history(r, recorded, code, later)
            )
        log.info("continuation %s resolved as %s by operator", cid, res.kind)
        return status_body(rec)

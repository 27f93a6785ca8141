"""Delivery: receipted, never blindly repeated. The record is durably ``delivery_in_flight``
before a channel is called; each chunk's receipt is recorded before the next chunk; a post
that may have happened but was not confirmed becomes ``delivery_unknown`` for an operator."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

import anyio

from ..app.ports import WorkerPorts
from ..continuations import lifecycle
from ..continuations.actions import answer_starts_delivery
from ..continuations.model import Continuation, Receipt
from ..disk import DiskError
from ..history import ConversationHistory, Message
from ..store import RecordTooLarge
from ..wal import TransactionTooLarge
from .channels import ChunkDelivery, ChunkReceipt, ReconcilingChannel, can_reconcile, split_chunks
from .errors import PermanentDeliveryError, RetryableDeliveryError, UnconfirmedDeliveryError
from .routes import Routes
from .steps import Steps

log = logging.getLogger("afterword.worker")


class Delivery(Steps):
    def __init__(
        self,
        ports: WorkerPorts,
        routes: Routes,
        history: ConversationHistory | None,
        jitter: Callable[[], float],
    ) -> None:
        super().__init__(ports)
        self.routes = routes
        self.history = history
        self.jitter = jitter  # the share of the backoff that is random, in [0, 1)

    async def deliver(self, cid: str, *, answer: str | None = None) -> None:
        """Deliver ``cid``'s answer. ``answer``: a local synthesizer's text for a record still
        ``result_received``, not committed yet; it is committed with the start of the delivery
        in one step where the core allows it (``answer_starts_delivery``), else on its own first."""
        ports = self.ports
        now = self.now
        if answer is not None and not self.folds(cid):
            local = answer
            await self.transition(cid, lambda r: lifecycle.synthesize_locally(r, local, now()))
            answer = None
        rec = ports.repo.get(cid)
        if rec is None:
            return
        if answer is None and (rec.state not in ("ready_to_deliver", "delivery_retry") or rec.text is None):
            return
        if not ports.claim_intact(rec):
            await self.binding_failed(cid, ())
            return
        if rec.claim.mode == "capture":
            receipt = Receipt(kind="captured", delivered_at_ms=now())
            await self.transition(cid, lambda r: lifecycle.delivered(r, receipt, now()))
            log.info("continuation %s captured", cid)
            return
        problem = self.routes.problem(rec)
        if problem is not None:
            await self.transition(cid, lambda r: lifecycle.dead_letter(r, problem[0], problem[1], now()))
            log.warning("continuation %s dead-lettered at delivery: %s", cid, problem[0])
            return
        dest = rec.claim.reply_to
        assert dest is not None
        found = self.routes.channel(dest)
        assert found is not None
        channel = found[0]
        text = rec.text if answer is None else answer
        assert text is not None
        chunks = split_chunks(text, channel.max_chunk_chars)
        if answer is None:
            rec = await self.transition(cid, lambda r: lifecycle.begin_delivery(r, now()))
        else:
            rec = await self.transition(
                cid, lambda r: lifecycle.synthesize_locally(r, text, now(), start_delivery=True)
            )
        receipts: list[ChunkReceipt] = []
        timeout = ports.config.limits.delivery_timeout_ms / 1000
        try:
            with anyio.fail_after(timeout):
                for index, chunk in enumerate(chunks):
                    # Re-checked before every channel call: the destination comes from the
                    # claim, and only an authentic claim may route a post.
                    current = ports.repo.get(cid)
                    if current is None or current.claim != rec.claim or not ports.claim_intact(current):
                        await self.binding_failed(cid, tuple(r.delivery_id for r in receipts))
                        return
                    chunk_receipt = await channel.post(
                        ChunkDelivery(
                            delivery_key=f"{cid}:{index}",
                            conversation_id=dest,
                            chunk_index=index,
                            chunk_count=len(chunks),
                            text=chunk,
                        )
                    )
                    receipts.append(chunk_receipt)
                    if index < len(chunks) - 1:
                        # Durable before the next chunk: after a crash the operator can see
                        # exactly which parts of the answer were posted.
                        await self.record_chunk(cid, chunk_receipt.delivery_id)
        except anyio.get_cancelled_exc_class():
            await self.shielded(
                cid,
                lambda r: lifecycle.delivery_unknown(
                    r, "delivery_interrupted", "worker stopped mid-post", now()
                ),
            )
            raise
        except (RetryableDeliveryError, PermanentDeliveryError) as exc:
            if receipts:
                await self.partial(cid, receipts, exc.code)
                return
            retryable = isinstance(exc, RetryableDeliveryError)
            delay = lifecycle.backoff_ms(rec.attempts.delivery, self.jitter())
            if isinstance(exc, RetryableDeliveryError) and exc.retry_after_s is not None:
                delay = max(delay, int(exc.retry_after_s * 1000))
            at = now() + delay
            code, message = exc.code, str(exc)
            await self.transition(
                cid,
                lambda r: lifecycle.delivery_failed(
                    r, retryable=retryable, code=code, message=message, next_attempt_at_ms=at, now_ms=now()
                ),
            )
            log.info("continuation %s delivery attempt failed (%s)", cid, code)
            return
        except UnconfirmedDeliveryError as exc:
            if receipts:
                await self.partial(cid, receipts, exc.code)
                return
            code, message = exc.code, str(exc)
            await self.transition(cid, lambda r: lifecycle.delivery_unknown(r, code, message, now()))
            log.warning("continuation %s: delivery outcome unknown (%s)", cid, code)
            return
        except TimeoutError:
            await self.transition(
                cid,
                lambda r: lifecycle.delivery_unknown(
                    r, "delivery_timeout", "channel did not answer in time", now()
                ),
            )
            return
        except DiskError:
            # The store refused a write mid-post (a chunk receipt): not a channel outcome. The
            # record stays durably in flight, so nothing posts it again in this process, and the
            # next start settles it as after a crash (reconciled, or delivery_interrupted).
            raise
        except Exception as exc:
            reason = type(exc).__name__
            if receipts:  # the chunks already confirmed stay on the record, as for any partial post
                await self.partial(cid, receipts, reason)
                return
            await self.transition(
                cid, lambda r: lifecycle.delivery_unknown(r, "delivery_error", reason, now())
            )
            return
        await self.confirmed(cid, rec, receipts, timeout)

    def folds(self, cid: str) -> bool:
        """Whether a local answer for ``cid`` goes in one commit with the delivery's start."""
        rec = self.ports.repo.get(cid)
        if rec is None or rec.claim.reply_to is None or self.routes.problem(rec) is not None:
            return False
        found = self.routes.channel(rec.claim.reply_to)
        return found is not None and answer_starts_delivery(rec, channel_reconciles=can_reconcile(found[0]))

    async def confirmed(
        self, cid: str, rec: Continuation, receipts: list[ChunkReceipt], timeout: float
    ) -> None:
        """Every chunk is confirmed: from here the outcome is "delivered" whatever the history
        append does, so a hung append is bounded and an interrupted one still records it."""
        now = self.now

        def posted(recorded: bool, history_code: str | None) -> Receipt:
            return Receipt(
                kind="posted",
                delivered_at_ms=now(),
                channel_id=receipts[0].channel_id if receipts else None,
                delivery_ids=tuple(r.delivery_id for r in receipts),
                history_recorded=recorded,
                history_error_code=history_code,
            )

        recorded = False
        history_code: str | None = "history_timeout"
        try:
            with anyio.move_on_after(timeout):
                recorded, history_code = await self.record_history(rec)
        except anyio.get_cancelled_exc_class():
            interrupted = posted(False, "history_interrupted")
            await self.shielded(cid, lambda r: lifecycle.settle_post(r, interrupted, now()))
            raise
        receipt = posted(recorded, history_code)
        # settle_post, not delivered: should anything have ended the record while the post was
        # in flight, the receipt is kept beside the state it was given instead of dropped.
        await self.transition(cid, lambda r: lifecycle.settle_post(r, receipt, now()))
        log.info("continuation %s delivered (%d chunk(s))", cid, len(receipts))

    async def record_chunk(self, cid: str, delivery_id: str) -> None:
        await self.transition(cid, lambda r: lifecycle.record_chunk(r, delivery_id, self.now()))

    async def binding_failed(self, cid: str, posted: tuple[str, ...]) -> None:
        """Immutable claim metadata was altered: dead-letter; post nothing (more)."""
        now = self.now

        def fn(r: Continuation) -> Continuation:
            for delivery_id in posted:
                if delivery_id not in r.chunk_receipts:
                    r = lifecycle.record_chunk(r, delivery_id, now())
            return lifecycle.dead_letter(r, "binding_invalid", "claim metadata was altered", now())

        await self.transition(cid, fn)
        log.error("continuation %s dead-lettered at delivery: claim binding failed", cid)

    async def partial(self, cid: str, receipts: list[ChunkReceipt], code: str) -> None:
        now = self.now

        def fn(r: Continuation) -> Continuation:
            for item in receipts:
                if item.delivery_id not in r.chunk_receipts:
                    r = lifecycle.record_chunk(r, item.delivery_id, now())
            return lifecycle.delivery_unknown(
                r, "partial_delivery", f"{len(receipts)} chunk(s) posted, then {code}", now()
            )

        await self.transition(cid, fn)
        log.warning("continuation %s: partial delivery, outcome unknown", cid)

    async def record_history(self, rec: Continuation) -> tuple[bool, str | None]:
        """Append the delivered answer to the bound conversation's history (idempotent)."""
        conversation = rec.claim.conversation_id
        if self.history is None or not conversation or rec.text is None:
            return False, "no_history"
        message = Message(
            id=f"{rec.id}:answer",
            role="assistant",
            content=rec.text,
            meta={"kind": "continuation", "continuationId": rec.id},
        )
        try:
            await self.history.append(conversation, [message])
        except Exception as exc:
            log.warning("continuation %s: history append failed (%s)", rec.id, type(exc).__name__)
            return False, type(exc).__name__[:64]
        return True, None

    # -- after a crash -----------------------------------------------------------------------
    async def reconcile_interrupted(self) -> int:
        """Before recovery: settle deliveries a crash interrupted, where the channel can prove
        what it holds (the outbox). Each chunk's delivery key is looked up: all present is a
        delivery with those receipts, anything else resumes and posts only what is missing.
        Records on channels that cannot reconcile are left to recovery (delivery_unknown).
        Returns the number of records settled this way."""
        settled = 0
        for rec in list(self.ports.repo.live()):
            if rec.state not in ("ready_to_deliver", "delivery_retry") or rec.text is None:
                continue
            if not (rec.delivery_in_flight or rec.chunk_receipts) or not rec.claim.reply_to:
                continue
            found = self.routes.channel(rec.claim.reply_to)
            if found is None or not can_reconcile(found[0]) or not self.ports.claim_intact(rec):
                continue
            try:
                if await self._reconcile_one(rec, rec.text, cast(ReconcilingChannel, found[0])):
                    settled += 1
            except (RecordTooLarge, TransactionTooLarge):
                # Its next version does not fit: recovery parks it. Startup must go on.
                log.error("continuation %s: reconciliation left to recovery (record too large)", rec.id)
        return settled

    async def _reconcile_one(self, rec: Continuation, text: str, channel: ReconcilingChannel) -> bool:
        now = self.now
        keys = [f"{rec.id}:{i}" for i in range(len(split_chunks(text, channel.max_chunk_chars)))]
        try:
            held = await channel.lookup(keys)
        except Exception as exc:  # unproven after all: recovery declares it unknown
            log.warning("continuation %s: reconciliation failed (%s)", rec.id, type(exc).__name__)
            return False
        ids = [held[k].delivery_id if k in held else None for k in keys]
        channel_id = next((r.channel_id for r in held.values()), None)
        if ids and all(ids):
            # Every chunk is there: as on the normal path, the answer joins the history before
            # the record says delivered, so a crash in between leaves it to reconcile again
            # (the append is idempotent) rather than delivered without its history.
            recorded, code = await self.record_history(rec)
            new = await self.transition(
                rec.id,
                lambda r: lifecycle.with_history(
                    lifecycle.reconcile(r, ids, channel_id, now()), recorded, code, now()
                ),
            )
        else:
            new = await self.transition(rec.id, lambda r: lifecycle.reconcile(r, ids, channel_id, now()))
        log.info("continuation %s: interrupted delivery reconciled (%s)", rec.id, new.state)
        return True

"""The worker loop: at-most-once synthesis and receipted delivery, within a concurrency bound.

Each continuation is handled by at most one task at a time. Before the model is called the
record is durably ``synthesizing``; before a channel is called it is durably
``delivery_in_flight``. An interruption at either point is therefore visible after a restart
and turns into ``dead_lettered`` or ``delivery_unknown`` rather than a repeat.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import anyio
import msgspec
from anyio.abc import TaskGroup, TaskStatus

from ..app.repository import IndexCorrupt
from ..app.service import ContinuationService
from ..blobs import BlobBindingError, BlobError
from ..config import ChannelConfig, channel_allows
from ..continuations import lifecycle
from ..continuations.actions import next_action
from ..continuations.capabilities import verify_claim_mac
from ..continuations.errors import ContinuationError, InvalidTransition, SnapshotError
from ..continuations.model import Continuation, Receipt, canonical_claim
from ..continuations.rules import is_actionable
from ..continuations.snapshot import MAX_MESSAGES, SnapshotMessage, decode_snapshot, newest_whole_turns
from ..disk import DiskError
from ..errors import StateError
from ..store import RecordTooLarge, VersionConflict
from ..wal import TransactionTooLarge
from .channels import Channel, ChunkDelivery, ChunkReceipt, ReconcilingChannel, can_reconcile, split_chunks
from .errors import PermanentDeliveryError, RetryableDeliveryError, UnconfirmedDeliveryError
from .synth import ContextMessage, SynthesisRequest, Synthesizer, context_messages

log = logging.getLogger("afterword.worker")
SCAN_INTERVAL_S = 1.0
RETENTION_INTERVAL_S = 60.0
DRAIN_SECONDS = 10.0
_json = msgspec.json.Decoder()


class BindingInvalid(StateError):
    """Immutable claim metadata failed its HMAC: dead-letter, deliver nothing."""


class Fallback(StateError):
    """Origin context cannot be restored; use the fixed zero-model answer."""


class Worker:
    def __init__(
        self,
        service: ContinuationService,
        synthesizer: Synthesizer,
        channels: Mapping[str, Channel],
        history: Any,
        *,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.service = service
        self.synthesizer = synthesizer
        self.channels = channels
        self.history = history
        self._jitter = jitter
        self.limiter = anyio.CapacityLimiter(service.config.limits.max_concurrent)
        self._busy: set[str] = set()
        self._candidates: set[str] = set()
        self._stopping = False
        self._stopped = anyio.Event()
        self._tg: TaskGroup | None = None
        self._retention_running = False
        self.retention_interval_s = RETENTION_INTERVAL_S
        self.drain_seconds = DRAIN_SECONDS  # how long stop() lets in-flight work finish
        service.on_change.append(self._on_change)

    # -- scheduling --------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self._candidates) + len(self._busy)

    def _on_change(self, old: Continuation | None, new: Continuation) -> None:
        if new.state in ("result_received", "ready_to_deliver", "delivery_retry"):
            self._candidates.add(new.id)

    def _action(self, rec: Continuation, now: int) -> str | None:
        # The decision is the pure core's (continuations.actions); waits are left to the scan.
        kind = next_action(rec, now).kind
        return None if kind in ("wait", "none") else kind

    def _dispatch(self, tg: TaskGroup, full_scan: bool) -> None:
        now = self.service.clock_ms()
        ids = [r.id for r in self.service.repo.live()] if full_scan else list(self._candidates)
        self._candidates.clear()
        for cid in ids:
            if cid in self._busy:
                continue
            rec = self.service.repo.get(cid)
            if rec is None:
                continue
            action = self._action(rec, now)
            if action is not None:
                self._busy.add(cid)
                tg.start_soon(self._run_one, cid, action)

    async def run_due(self, ids: Iterable[str] | None = None) -> list[str]:
        """Run the due action of each record in ``ids`` (default: every live record), one at a
        time and in that order, and return the ids acted on. For hosts and tests that drive the
        worker themselves instead of running :meth:`run` (the order is then reproducible)."""
        now = self.service.clock_ms()
        acted: list[str] = []
        for cid in list(ids) if ids is not None else [r.id for r in self.service.repo.live()]:
            rec = self.service.repo.get(cid)
            if rec is None or cid in self._busy:
                continue
            action = self._action(rec, now)
            if action is None:
                continue
            self._busy.add(cid)
            acted.append(cid)
            await self._run_one(cid, action)
        return acted

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            last_scan = 0.0
            last_retention = anyio.current_time()
            corrupt_reported = False
            while not self._stopping:
                if anyio.current_time() - last_retention >= self.retention_interval_s:
                    last_retention = anyio.current_time()
                    tg.start_soon(self._retention)
                self.service.work_available = anyio.Event()
                now = anyio.current_time()
                full = now - last_scan >= SCAN_INTERVAL_S
                if full:
                    last_scan = now
                try:
                    self._dispatch(tg, full)
                except IndexCorrupt as exc:
                    # Fail closed: no work is started from an index that no longer matches
                    # durable state; health and every request report it until a restart.
                    if not corrupt_reported:
                        log.error("worker stopped dispatching: %s", exc)
                        corrupt_reported = True
                with anyio.move_on_after(SCAN_INTERVAL_S):
                    await self.service.work_available.wait()
            with anyio.move_on_after(self.drain_seconds):
                while self._busy:
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        self._stopped.set()

    async def _retention(self) -> None:
        if self._retention_running:
            return
        self._retention_running = True
        try:
            await self.service.apply_retention()
        except (ContinuationError, VersionConflict, DiskError) as exc:
            log.warning("retention pass failed: %s", type(exc).__name__)
        finally:
            self._retention_running = False

    async def stop(self) -> None:
        """Stop taking work, let in-flight work finish within the drain bound."""
        self._stopping = True
        self.service.work_available.set()
        if self._tg is not None:
            with anyio.move_on_after(self.drain_seconds + 2):
                await self._stopped.wait()

    async def _run_one(self, cid: str, action: str) -> None:
        try:
            async with self.limiter:
                if action == "expire":
                    await self._transition(cid, lambda r: lifecycle.expire(r, self.service.clock_ms()))
                elif action == "synthesize":
                    await self.synthesize(cid)
                elif action == "hold":
                    await self._transition(cid, lambda r: lifecycle.hold_unproven(r, self.service.clock_ms()))
                    log.warning("continuation %s held: its earlier post was never proven", cid)
                else:
                    await self.deliver(cid)
        except (InvalidTransition, VersionConflict) as exc:
            # Someone else (an operator, a concurrent request) changed the record first.
            log.info("continuation %s: %s skipped (%s)", cid, action, type(exc).__name__)
        except ContinuationError as exc:
            log.warning("continuation %s: %s failed: %s", cid, action, exc)
        except DiskError as exc:
            log.error("continuation %s: %s stopped by a storage failure: %s", cid, action, type(exc).__name__)
        except Exception as exc:
            # A malformed record or a bug must not take the worker (and the service) down, nor
            # crash-loop every restart on the same record: park it where an operator sees it.
            log.error("continuation %s: %s failed unexpectedly: %s", cid, action, type(exc).__name__)
            await self._park(cid, type(exc).__name__)
        finally:
            self._busy.discard(cid)
            self.service.work_available.set()

    async def _transition(self, cid: str, fn: Callable[[Continuation], Continuation | None]) -> Continuation:
        rec, _ = await self.service.transition(cid, fn)
        return rec

    async def _shielded(self, cid: str, fn: Callable[[Continuation], Continuation | None]) -> None:
        # If this fails too, recovery at the next start reaches the same verdict.
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(5),
            contextlib.suppress(ContinuationError, VersionConflict, DiskError),
        ):
            await self._transition(cid, fn)

    async def _park(self, cid: str, reason: str) -> None:
        now = self.service.clock_ms()

        def fn(r: Continuation) -> Continuation | None:
            if r.terminal:
                return None
            if r.delivery_in_flight or r.chunk_receipts:  # posting may have begun: never repost
                return lifecycle.delivery_unknown(r, "internal_error", reason, now)
            return lifecycle.dead_letter(r, "internal_error", reason, now)

        await self._shielded(cid, fn)

    # -- destination checks ------------------------------------------------------------------
    def _channel(self, destination: str) -> tuple[Channel, ChannelConfig | None] | None:
        segment = destination.split(":", 1)[0]
        configured = self.service.config.channel_for(destination)
        cfg = configured[1] if configured else None
        if segment in self.channels:
            return self.channels[segment], cfg
        if "*" in self.channels:
            return self.channels["*"], cfg
        return None

    def _destination_problem(self, rec: Continuation) -> tuple[str, str] | None:
        if rec.claim.mode not in ("reply", "notify_if_actionable"):
            return None
        dest = rec.claim.reply_to
        if not dest:
            return ("no_destination", "no physical route is bound")
        found = self._channel(dest)
        if found is None:
            return ("no_channel", "no channel adapter serves this conversation")
        _, cfg = found
        if cfg is not None and not channel_allows(cfg, dest):
            return ("destination_revoked", "the channel allowlist no longer admits this destination")
        return None

    # -- synthesis ---------------------------------------------------------------------------
    async def _context(self, rec: Continuation) -> tuple[ContextMessage, ...]:
        claim = rec.claim
        if rec.origin_context == "pinned":
            if rec.snapshot_digest is None or rec.snapshot_mac is None:
                raise Fallback("no snapshot bound")
            try:
                self.service.blobs.verify_binding(
                    rec.snapshot_digest, canonical_claim(claim), rec.snapshot_mac
                )
            except (BlobBindingError, ValueError):  # ValueError: the stored digest is malformed
                raise BindingInvalid("snapshot binding does not verify") from None
            try:
                data = await anyio.to_thread.run_sync(self.service.blobs.get, rec.snapshot_digest)
                snapshot = decode_snapshot(data)
            except (BlobError, DiskError, OSError, SnapshotError) as exc:
                raise Fallback(type(exc).__name__) from None
            if snapshot.conversation_id != claim.conversation_id:
                raise Fallback("snapshot belongs to another conversation")
            return context_messages(snapshot.messages)
        if rec.origin_context == "detached_latest":
            if not claim.conversation_id or self.history is None:
                return ()
            latest = await self.history.latest(claim.conversation_id, MAX_MESSAGES)
            # The same caps as an origin snapshot (64 messages, 64 KiB each, 256 KiB in all;
            # whole oldest turns dropped): the detached context is bounded in bytes too.
            bounded = newest_whole_turns(
                [SnapshotMessage(role=m.role, content=m.content) for m in latest if m.role in ("user", "assistant")]
            )
            return context_messages(bounded)
        raise Fallback(rec.origin_context)

    async def synthesize(self, cid: str) -> None:
        svc = self.service
        rec = svc.repo.get(cid)
        if rec is None or rec.state != "result_received" or rec.deferred or rec.result is None:
            return
        now = svc.clock_ms
        if not verify_claim_mac(svc._k_claim_mac, rec.claim, rec.claim_mac):
            await self._transition(
                cid,
                lambda r: lifecycle.dead_letter(r, "binding_invalid", "claim metadata was altered", now()),
            )
            log.error("continuation %s dead-lettered: claim binding failed", cid)
            return
        try:
            payload = _json.decode(await svc.result_payload(rec))
        except BlobError as exc:
            # The accepted payload is gone or damaged: nothing to synthesize from, and retrying
            # cannot bring it back. Park it where an operator sees it.
            why = type(exc).__name__
            await self._transition(
                cid, lambda r: lifecycle.dead_letter(r, "payload_unreadable", why, now())
            )
            log.error("continuation %s dead-lettered: result payload unreadable", cid)
            return
        mode = rec.claim.mode
        if mode == "silent":
            await self._transition(cid, lambda r: lifecycle.prepare_without_model(r, "silent", now()))
            return
        if mode == "notify_if_actionable" and not is_actionable(payload):
            await self._transition(cid, lambda r: lifecycle.prepare_without_model(r, "suppressed", now()))
            return
        problem = self._destination_problem(rec)
        if problem is not None:
            await self._transition(cid, lambda r: lifecycle.dead_letter(r, problem[0], problem[1], now()))
            return
        try:
            messages = await self._context(rec)
        except BindingInvalid:
            await self._transition(
                cid,
                lambda r: lifecycle.dead_letter(r, "binding_invalid", "snapshot binding was altered", now()),
            )
            log.error("continuation %s dead-lettered: snapshot binding failed", cid)
            return
        except Fallback as why:
            log.info("continuation %s: origin context unavailable (%s); fixed answer", cid, why)
            rec = await self._transition(
                cid, lambda r: lifecycle.prepare_without_model(r, "origin_context_unavailable", now())
            )
        else:
            rec = await self._transition(cid, lambda r: lifecycle.begin_synthesis(r, now()))
            request = SynthesisRequest(
                continuation_id=cid,
                mode=mode,
                conversation_id=rec.claim.conversation_id,
                origin_context=rec.origin_context,
                messages=messages,
                payload=payload,
            )
            timeout = svc.config.limits.synthesis_timeout_ms / 1000
            try:
                with anyio.fail_after(timeout):
                    text = await self.synthesizer.synthesize(request)
            except anyio.get_cancelled_exc_class():
                await self._shielded(
                    cid,
                    lambda r: lifecycle.fail_synthesis(r, "synthesis_interrupted", "worker stopped", now()),
                )
                raise
            except TimeoutError:
                await self._transition(
                    cid,
                    lambda r: lifecycle.fail_synthesis(r, "synthesis_timeout", "synthesis timed out", now()),
                )
                return
            except Exception as exc:  # any model failure is ambiguous: never repeated
                reason = type(exc).__name__
                await self._transition(
                    cid, lambda r: lifecycle.fail_synthesis(r, "synthesis_failed", reason, now())
                )
                return
            if not isinstance(text, str) or not text:
                await self._transition(
                    cid, lambda r: lifecycle.fail_synthesis(r, "synthesis_empty", "empty answer", now())
                )
                return
            rec = await self._transition(cid, lambda r: lifecycle.finish_synthesis(r, text, now()))
        await self.deliver(cid)

    # -- delivery ----------------------------------------------------------------------------
    async def deliver(self, cid: str) -> None:
        svc = self.service
        now = svc.clock_ms
        rec = svc.repo.get(cid)
        if rec is None or rec.state not in ("ready_to_deliver", "delivery_retry") or rec.text is None:
            return
        if not self._binding_intact(rec):
            await self._binding_failed(cid, ())
            return
        if rec.claim.mode == "capture":
            receipt = Receipt(kind="captured", delivered_at_ms=now())
            await self._transition(cid, lambda r: lifecycle.delivered(r, receipt, now()))
            log.info("continuation %s captured", cid)
            return
        problem = self._destination_problem(rec)
        if problem is not None:
            await self._transition(cid, lambda r: lifecycle.dead_letter(r, problem[0], problem[1], now()))
            log.warning("continuation %s dead-lettered at delivery: %s", cid, problem[0])
            return
        dest = rec.claim.reply_to
        assert dest is not None
        found = self._channel(dest)
        assert found is not None
        channel = found[0]
        chunks = split_chunks(rec.text, channel.max_chunk_chars)
        rec = await self._transition(cid, lambda r: lifecycle.begin_delivery(r, now()))
        receipts: list[ChunkReceipt] = []
        timeout = svc.config.limits.delivery_timeout_ms / 1000
        try:
            with anyio.fail_after(timeout):
                for index, chunk in enumerate(chunks):
                    # Re-checked before every channel call: the destination comes from the
                    # claim, and only an authentic claim may route a post.
                    current = svc.repo.get(cid)
                    if current is None or current.claim != rec.claim or not self._binding_intact(current):
                        await self._binding_failed(cid, tuple(r.delivery_id for r in receipts))
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
                        await self._record_chunk(cid, chunk_receipt.delivery_id)
        except anyio.get_cancelled_exc_class():
            await self._shielded(
                cid,
                lambda r: lifecycle.delivery_unknown(
                    r, "delivery_interrupted", "worker stopped mid-post", now()
                ),
            )
            raise
        except (RetryableDeliveryError, PermanentDeliveryError) as exc:
            if receipts:
                await self._partial(cid, receipts, exc.code)
                return
            retryable = isinstance(exc, RetryableDeliveryError)
            delay = lifecycle.backoff_ms(rec.attempts.delivery, self._jitter())
            if isinstance(exc, RetryableDeliveryError) and exc.retry_after_s is not None:
                delay = max(delay, int(exc.retry_after_s * 1000))
            at = now() + delay
            code, message = exc.code, str(exc)
            await self._transition(
                cid,
                lambda r: lifecycle.delivery_failed(
                    r,
                    retryable=retryable,
                    code=code,
                    message=message,
                    next_attempt_at_ms=at,
                    now_ms=now(),
                ),
            )
            log.info("continuation %s delivery attempt failed (%s)", cid, code)
            return
        except UnconfirmedDeliveryError as exc:
            if receipts:
                await self._partial(cid, receipts, exc.code)
                return
            code, message = exc.code, str(exc)
            await self._transition(cid, lambda r: lifecycle.delivery_unknown(r, code, message, now()))
            log.warning("continuation %s: delivery outcome unknown (%s)", cid, code)
            return
        except TimeoutError:
            await self._transition(
                cid,
                lambda r: lifecycle.delivery_unknown(
                    r, "delivery_timeout", "channel did not answer in time", now()
                ),
            )
            return
        except Exception as exc:
            reason = type(exc).__name__
            await self._transition(
                cid, lambda r: lifecycle.delivery_unknown(r, "delivery_error", reason, now())
            )
            return

        def posted(recorded: bool, history_code: str | None) -> Receipt:
            return Receipt(
                kind="posted",
                delivered_at_ms=now(),
                channel_id=receipts[0].channel_id if receipts else None,
                delivery_ids=tuple(r.delivery_id for r in receipts),
                history_recorded=recorded,
                history_error_code=history_code,
            )

        # Every chunk is confirmed: from here the outcome is "delivered" whatever the history
        # append does, so a hung append is bounded and an interrupted one still records it.
        recorded = False
        history_code: str | None = "history_timeout"
        try:
            with anyio.move_on_after(timeout):
                recorded, history_code = await self.record_history(rec)
        except anyio.get_cancelled_exc_class():
            interrupted = posted(False, "history_interrupted")
            await self._shielded(cid, lambda r: lifecycle.delivered(r, interrupted, now()))
            raise
        receipt = posted(recorded, history_code)
        await self._transition(cid, lambda r: lifecycle.delivered(r, receipt, now()))
        log.info("continuation %s delivered (%d chunk(s))", cid, len(receipts))

    async def reconcile_interrupted(self) -> int:
        """Before recovery: settle deliveries a crash interrupted, where the channel can prove
        what it holds (the outbox). Each chunk's delivery key is looked up: all present is a
        delivery with those receipts, anything else resumes and posts only what is missing.
        Records on channels that cannot reconcile are left to recovery (delivery_unknown).
        Returns the number of records settled this way."""
        settled = 0
        for rec in list(self.service.repo.live()):
            if rec.state not in ("ready_to_deliver", "delivery_retry") or rec.text is None:
                continue
            if not (rec.delivery_in_flight or rec.chunk_receipts) or not rec.claim.reply_to:
                continue
            found = self._channel(rec.claim.reply_to)
            if found is None or not can_reconcile(found[0]) or not self._binding_intact(rec):
                continue
            try:
                if await self._reconcile_one(rec, rec.text, cast(ReconcilingChannel, found[0])):
                    settled += 1
            except (RecordTooLarge, TransactionTooLarge):
                # Its next version does not fit: recovery parks it. Startup must go on.
                log.error("continuation %s: reconciliation left to recovery (record too large)", rec.id)
        return settled

    async def _reconcile_one(self, rec: Continuation, text: str, channel: ReconcilingChannel) -> bool:
        now = self.service.clock_ms
        keys = [f"{rec.id}:{i}" for i in range(len(split_chunks(text, channel.max_chunk_chars)))]
        try:
            held = await channel.lookup(keys)
        except Exception as exc:  # unproven after all: recovery declares it unknown
            log.warning("continuation %s: reconciliation failed (%s)", rec.id, type(exc).__name__)
            return False
        ids = [held[k].delivery_id if k in held else None for k in keys]
        channel_id = next((r.channel_id for r in held.values()), None)
        new, _ = await self.service.transition(rec.id, lambda r: lifecycle.reconcile(r, ids, channel_id, now()))
        if new.state == "delivered":
            recorded, code = await self.record_history(new)
            await self.service.transition(rec.id, lambda r: lifecycle.with_history(r, recorded, code, now()))
        log.info("continuation %s: interrupted delivery reconciled (%s)", rec.id, new.state)
        return True

    def _binding_intact(self, rec: Continuation) -> bool:
        return verify_claim_mac(self.service._k_claim_mac, rec.claim, rec.claim_mac)

    async def _binding_failed(self, cid: str, posted: tuple[str, ...]) -> None:
        """Immutable claim metadata was altered: dead-letter; post nothing (more)."""
        now = self.service.clock_ms

        def fn(r: Continuation) -> Continuation:
            for delivery_id in posted:
                if delivery_id not in r.chunk_receipts:
                    r = lifecycle.record_chunk(r, delivery_id, now())
            return lifecycle.dead_letter(r, "binding_invalid", "claim metadata was altered", now())

        await self._transition(cid, fn)
        log.error("continuation %s dead-lettered at delivery: claim binding failed", cid)

    async def _record_chunk(self, cid: str, delivery_id: str) -> None:
        now = self.service.clock_ms
        await self._transition(cid, lambda r: lifecycle.record_chunk(r, delivery_id, now()))

    async def _partial(self, cid: str, receipts: list[ChunkReceipt], code: str) -> None:
        now = self.service.clock_ms

        def fn(r: Continuation) -> Continuation:
            for item in receipts:
                if item.delivery_id not in r.chunk_receipts:
                    r = lifecycle.record_chunk(r, item.delivery_id, now())
            return lifecycle.delivery_unknown(
                r, "partial_delivery", f"{len(receipts)} chunk(s) posted, then {code}", now()
            )

        await self._transition(cid, fn)
        log.warning("continuation %s: partial delivery, outcome unknown", cid)

    async def record_history(self, rec: Continuation) -> tuple[bool, str | None]:
        """Append the delivered answer to the bound conversation's history (idempotent)."""
        conversation = rec.claim.conversation_id
        if self.history is None or not conversation or rec.text is None:
            return False, "no_history"
        from ..history import Message

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

"""Synthesis: at most once per continuation. The record is durably ``synthesizing`` before the
model is called, so an interruption is seen after a restart and never repeated. A local
synthesizer (the template) commits its answer in one step instead (``synthesis_plan``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import anyio
import msgspec

from ..app.ports import WorkerPorts
from ..blobs import BlobBindingError, BlobError
from ..continuations import lifecycle
from ..continuations.actions import synthesis_plan
from ..continuations.errors import SnapshotError
from ..continuations.model import Continuation, canonical_claim
from ..continuations.rules import is_actionable
from ..continuations.snapshot import MAX_MESSAGES, SnapshotMessage, decode_snapshot, newest_whole_turns
from ..disk import DiskError
from ..history import ConversationHistory
from .routes import Routes
from .steps import BindingInvalid, Fallback, Steps
from .synthesizers import (
    ContextMessage,
    SynthesisRequest,
    Synthesizer,
    context_messages,
    is_local,
    reads_context,
)

log = logging.getLogger("afterword.worker")
_json = msgspec.json.Decoder()


@dataclass(frozen=True)
class LocalAnswer:
    """A local synthesizer's answer, not committed yet (see ``Delivery.deliver``)."""

    text: str


class Synthesis(Steps):
    def __init__(
        self,
        ports: WorkerPorts,
        synthesizer: Synthesizer,
        routes: Routes,
        history: ConversationHistory | None,
    ) -> None:
        super().__init__(ports)
        self.synthesizer = synthesizer
        self.routes = routes
        self.history = history

    async def context(self, rec: Continuation) -> tuple[ContextMessage, ...]:
        """The conversation the answer continues: the bound origin snapshot, or for a
        detached claim the newest turns of its conversation's history."""
        claim = rec.claim
        blobs = self.ports.blobs
        if rec.origin_context == "pinned":
            if rec.snapshot_digest is None or rec.snapshot_mac is None:
                raise Fallback("no snapshot bound")
            try:
                blobs.verify_binding(rec.snapshot_digest, canonical_claim(claim), rec.snapshot_mac)
            except (BlobBindingError, ValueError):  # ValueError: the stored digest is malformed
                raise BindingInvalid("snapshot binding does not verify") from None
            try:
                data = await anyio.to_thread.run_sync(blobs.get, rec.snapshot_digest)
                snapshot = decode_snapshot(data)
            except (BlobError, DiskError, OSError, SnapshotError) as exc:
                raise Fallback(type(exc).__name__) from None
            if snapshot.conversation_id != claim.conversation_id:
                raise Fallback("snapshot belongs to another conversation")
            return context_messages(snapshot.messages)
        if rec.origin_context == "detached_latest":
            if not claim.conversation_id or self.history is None or not reads_context(self.synthesizer):
                return ()
            latest = await self.history.latest(claim.conversation_id, MAX_MESSAGES)
            # The same caps as an origin snapshot (64 messages, 64 KiB each, 256 KiB in all;
            # whole oldest turns dropped): the detached context is bounded in bytes too.
            bounded = newest_whole_turns(
                [
                    SnapshotMessage(role=m.role, content=m.content)
                    for m in latest
                    if m.role in ("user", "assistant")
                ]
            )
            return context_messages(bounded)
        raise Fallback(rec.origin_context)

    async def dead_letter(self, cid: str, code: str, message: str) -> None:
        await self.transition(cid, lambda r: lifecycle.dead_letter(r, code, message, self.now()))

    async def fail(self, cid: str, code: str, message: str) -> None:
        await self.transition(cid, lambda r: lifecycle.fail_synthesis(r, code, message, self.now()))

    async def run(self, cid: str) -> bool | LocalAnswer:
        """Synthesize ``cid`` if it is due; True when an answer is ready to deliver now. A
        local synthesizer's answer is returned uncommitted (:class:`LocalAnswer`): the caller
        commits it, together with the start of its delivery where the core allows it."""
        ports = self.ports
        rec = ports.repo.get(cid)
        if rec is None or rec.state != "result_received" or rec.deferred or rec.result is None:
            return False
        now = self.now
        if not ports.claim_intact(rec):
            await self.dead_letter(cid, "binding_invalid", "claim metadata was altered")
            log.error("continuation %s dead-lettered: claim binding failed", cid)
            return False
        try:
            payload = _json.decode(await ports.result_payload(rec))
        except BlobError as exc:
            # The accepted payload is gone or damaged: nothing to synthesize from, and retrying
            # cannot bring it back. Park it where an operator sees it.
            await self.dead_letter(cid, "payload_unreadable", type(exc).__name__)
            log.error("continuation %s dead-lettered: result payload unreadable", cid)
            return False
        mode = rec.claim.mode
        if mode == "silent":
            await self.transition(cid, lambda r: lifecycle.prepare_without_model(r, "silent", now()))
            return False
        if mode == "notify_if_actionable" and not is_actionable(payload):
            await self.transition(cid, lambda r: lifecycle.prepare_without_model(r, "suppressed", now()))
            return False
        problem = self.routes.problem(rec)
        if problem is not None:
            await self.dead_letter(cid, *problem)
            return False
        try:
            messages = await self.context(rec)
        except BindingInvalid:
            await self.dead_letter(cid, "binding_invalid", "snapshot binding was altered")
            log.error("continuation %s dead-lettered: snapshot binding failed", cid)
            return False
        except Fallback as why:
            log.info("continuation %s: origin context unavailable (%s); fixed answer", cid, why)
            await self.transition(
                cid, lambda r: lifecycle.prepare_without_model(r, "origin_context_unavailable", now())
            )
            return True
        plan = synthesis_plan(is_local(self.synthesizer))
        if plan.start is not None:
            rec = await self.transition(cid, lambda r: lifecycle.begin_synthesis(r, now()))
        request = SynthesisRequest(
            continuation_id=cid,
            mode=mode,
            conversation_id=rec.claim.conversation_id,
            origin_context=rec.origin_context,
            messages=messages,
            payload=payload,
        )
        timeout = ports.config.limits.synthesis_timeout_ms / 1000
        try:
            with anyio.fail_after(timeout):
                text = await self.synthesizer.synthesize(request)
        except anyio.get_cancelled_exc_class():
            if plan.interrupted is not None:
                await self.shielded(
                    cid,
                    lambda r: lifecycle.fail_synthesis(r, "synthesis_interrupted", "worker stopped", now()),
                )
            raise
        except TimeoutError:
            await self.fail(cid, "synthesis_timeout", "synthesis timed out")
            return False
        except Exception as exc:  # any model failure is ambiguous: never repeated
            await self.fail(cid, "synthesis_failed", type(exc).__name__)
            return False
        if not isinstance(text, str) or not text:
            await self.fail(cid, "synthesis_empty", "empty answer")
            return False
        if plan.finish == "synthesize_locally":
            return LocalAnswer(text)
        await self.transition(cid, lambda r: lifecycle.finish_synthesis(r, text, now()))
        return True

"""Results and status: the producer's PUT to ``resultUrl`` and its reads of ``statusUrl``."""

from __future__ import annotations

import logging

import anyio
import msgspec

from ..blobs import BlobCorruptError, BlobStore
from ..continuations import lifecycle
from ..continuations.errors import Closed, Conflict, InvalidTransition, NotFound
from ..continuations.model import INLINE_PAYLOAD_MAX, Continuation, ResultRecord, Tombstone
from ..continuations.rules import MAX_RESULT_BODY, canonical_hash, check_result, payload_hashes
from ..protocol.views import status_body
from ..protocol.wire import ResultRequest, StatusBody
from ..store import RecordStore
from .keys import ServiceKeys
from .ledger import Ledger

log = logging.getLogger("afterword.service")

PAYLOADS_DIR = "payloads"
PAYLOAD_QUOTA = 1 << 50  # no quota of its own: bounded by the records that reference them
# RFC 8785 text is built in Python: some microseconds for a small payload, tens of
# milliseconds near the 256 KiB limit. A large one is built on a worker thread, so the event
# loop keeps serving other requests meanwhile.
CANONICAL_ON_THREAD_FROM = 32 * 1024


def open_payload_store(store: RecordStore) -> BlobStore:
    """Out-of-line result payloads: their own directory, outside the snapshot quota (the
    admission limits already bound how many results can be live)."""
    return BlobStore(
        store.root, store.secret, rel_dir=PAYLOADS_DIR, quota=PAYLOAD_QUOTA, max_blob=MAX_RESULT_BODY
    )


def _same_payload(kept: str | None, claimed: str, payload: object) -> bool:
    """Whether an accepted result's hash stands for this payload, in either accepted form
    (a producer that upgraded between a submission and its repeat sends the other one)."""
    return kept == claimed or (kept is not None and kept in payload_hashes(payload))


class Results:
    def __init__(self, ledger: Ledger, keys: ServiceKeys, payloads: BlobStore) -> None:
        self.ledger = ledger
        self.repo = ledger.repo
        self.keys = keys
        self.payloads = payloads

    def authenticate_result(self, cid: str, token: str) -> None:
        """Refuse a result token not minted for ``cid`` (checked before the body is read)."""
        self.keys.check_result_token(cid, token)

    async def submit_result(self, cid: str, token: str, req: ResultRequest, body_len: int) -> StatusBody:
        self.keys.check_result_token(cid, token)
        args = (req.idempotency_key, req.payload_hash, req.payload, body_len)
        if body_len > CANONICAL_ON_THREAD_FROM:
            canonical = await anyio.to_thread.run_sync(check_result, *args)
        else:
            canonical = check_result(*args)
        async with self.ledger.locked([cid]):
            rec = self.repo.get(cid)
            if rec is None:
                tomb = self.repo.tombstone(cid)
                if tomb is None:
                    raise NotFound(f"no continuation {cid}")
                if tomb.idempotency_key == req.idempotency_key and _same_payload(
                    tomb.payload_hash, req.payload_hash, req.payload
                ):
                    return status_body(tomb)
                if tomb.idempotency_key is None:
                    raise Closed(f"continuation is {tomb.state}")
                raise Conflict("a different result was already accepted for this continuation")
            now = self.ledger.clock_ms()
            claimed = req.payload_hash
            kept = rec.result.payload_hash if rec.result is not None else None
            if kept is not None and _same_payload(kept, claimed, req.payload):
                claimed = kept  # the same payload hashed in the other accepted form: a repeat
            probe = ResultRecord(
                idempotency_key=req.idempotency_key, payload_hash=claimed, received_at_ms=now
            )
            if lifecycle.submit_result(rec, probe, now) is None:
                return status_body(rec)  # an identical repeat: nothing to store
            digest = None
            if len(canonical) > INLINE_PAYLOAD_MAX:
                # Out of line, so records stay small (see docs/storage-format.md): written and
                # fsynced before the record that references it commits, pinned until then.
                digest = await anyio.to_thread.run_sync(self.payloads.put, canonical)
            try:
                result = msgspec.structs.replace(
                    probe,
                    payload=b"" if digest is not None else canonical,
                    payload_digest=digest,
                    payload_size=len(canonical) if digest is not None else None,
                )
                new = lifecycle.submit_result(rec, result, now)
                assert new is not None
                await self.ledger.commit([(rec, new)])
            finally:
                if digest is not None:
                    self.payloads.unpin(digest)
            log.info("continuation %s result received%s", cid, " (deferred)" if new.deferred else "")
            return status_body(new)

    async def result_payload(self, rec: Continuation) -> bytes:
        """The accepted payload's bytes, inline or read back from the payload blob store and
        checked against both its blake3 name and the accepted payloadHash.

        Raises:
            BlobError: the payload blob is missing or does not match its digests.
        """
        result = rec.result
        if result is None:
            raise InvalidTransition(rec.state, "read result")
        if result.payload_digest is None:
            return result.payload
        data = await anyio.to_thread.run_sync(self.payloads.get, result.payload_digest)
        if canonical_hash(data) != result.payload_hash:
            raise BlobCorruptError(
                f"payload {result.payload_digest}: does not match the accepted payloadHash"
            )
        return data

    def status(self, cid: str, token: str) -> StatusBody:
        self.keys.check_result_token(cid, token)
        rec: Continuation | Tombstone | None = self.repo.get(cid) or self.repo.tombstone(cid)
        if rec is None:
            raise NotFound(f"no continuation {cid}")
        return status_body(rec)

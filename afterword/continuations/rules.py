"""Validation rules for claims and results (pure; ``now_ms`` passed in)."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, date, datetime

import msgspec

from .errors import InvalidRequest, RequestTooLarge
from .jcs import NotCanonical, canonical_json

MAX_DEADLINE_MS = 30 * 24 * 3600 * 1000
MAX_RESULT_BODY = 256 * 1024
MAX_CLAIM_BODY = 16 * 1024
# fullmatch, not match with "$": "$" also matches before a trailing newline.
_TASK_KEY_RE = re.compile(r"[\x21-\x7e]{1,256}")
_HASH_RE = re.compile(r"[0-9a-f]{64}")
# Host API strings: free text without control characters (C0, DEL or C1: nothing that ends
# a log line or drives a terminal), bounded like a taskKey (run id) or as the config bounds a
# conversation id. A run id also names its run in one URL path segment, so it has no '/'.
MAX_RUN_ID = 256
MAX_ROUTE_ID = 1024
RUN_ID_PATTERN = "[^\\x00-\\x1f\\x7f-\\x9f/]"
ROUTE_ID_PATTERN = "[^\\x00-\\x1f\\x7f-\\x9f]"
_RUN_ID_RE = re.compile(f"{RUN_ID_PATTERN}{{1,{MAX_RUN_ID}}}")
_ROUTE_ID_RE = re.compile(f"{ROUTE_ID_PATTERN}{{1,{MAX_ROUTE_ID}}}")
# RFC 3339 date-time in UTC. datetime.fromisoformat alone also takes ISO 8601 forms RFC 3339
# does not allow (basic format, week dates, missing seconds, comma fractions).
_RFC3339_UTC = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?(?:Z|\+00:00)"
)
_json_sorted = msgspec.json.Encoder(order="sorted")


def parse_deadline(value: str, now_ms: int) -> int:
    """RFC 3339 in UTC, in the future, at most 30 days away; returns epoch ms."""
    ms = parse_deadline_format(value)
    check_deadline_window(ms, now_ms)
    return ms


def parse_deadline_format(value: str) -> int:
    """RFC 3339 in UTC; returns epoch ms (no check against the clock)."""
    if not isinstance(value, str) or not _RFC3339_UTC.fullmatch(value):
        raise InvalidRequest("deadline must be an RFC 3339 UTC timestamp like 2030-01-02T03:04:05.000Z")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest("deadline is not a valid RFC 3339 timestamp") from None
    if parsed.tzinfo is None or parsed.utcoffset() != UTC.utcoffset(None):
        raise InvalidRequest("deadline must be in UTC")
    return int(parsed.timestamp() * 1000)


def check_deadline_window(ms: int, now_ms: int) -> None:
    """A new claim's deadline must be in the future and at most 30 days away."""
    if ms <= now_ms:
        raise InvalidRequest("deadline must be in the future")
    if ms - now_ms > MAX_DEADLINE_MS:
        raise InvalidRequest("deadline must be at most 30 days away")


_EPOCH_DAY = date(1970, 1, 1).toordinal()
_YEAR_10000_MS = 253_402_300_800_000


def format_ms(ms: int) -> str:
    """``ms`` since the epoch as RFC 3339 UTC with milliseconds, e.g. ``2030-01-01T00:00:00.007Z``.

    Every claim and status response formats several of these; integer arithmetic and a date
    from its ordinal cost half of an aware ``datetime`` and ``strftime`` (same text)."""
    if 0 <= ms < _YEAR_10000_MS:
        day, rem = divmod(ms, 86_400_000)
        seconds, millis = divmod(rem, 1000)
        minutes, seconds = divmod(seconds, 60)
        hours, minutes = divmod(minutes, 60)
        return f"{date.fromordinal(_EPOCH_DAY + day).isoformat()}T{hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}Z"
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def check_task_key(value: str, field: str = "taskKey") -> None:
    if not isinstance(value, str) or not _TASK_KEY_RE.fullmatch(value):
        raise InvalidRequest(f"{field} must be 1-256 printable ASCII characters without spaces")


def check_host_run(run_id: str, conversation_id: str, reply_to: str | None) -> None:
    """The strings a host names a run with (``POST /v1/host/runs``)."""
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id) or run_id in (".", ".."):
        raise InvalidRequest(
            f"runId must be 1-{MAX_RUN_ID} characters without '/' or control characters, and not '.' or '..'"
        )
    for field, value in (("conversationId", conversation_id), ("replyTo", reply_to)):
        if value is not None and (not isinstance(value, str) or not _ROUTE_ID_RE.fullmatch(value)):
            raise InvalidRequest(f"{field} must be 1-{MAX_ROUTE_ID} characters without control characters")


def check_task_hash(value: str) -> None:
    check_task_key(value, "taskHash")


def payload_hash(payload: object) -> str:
    """Lowercase hex sha256 of the payload's RFC 8785 canonical JSON, taken of the value as it
    goes on the wire (structs, dates and bytes as msgspec encodes them).

    The one definition of ``payloadHash`` (docs/payload-hash.md): the producer helper
    computes it, and the service keeps the canonical bytes it covers.

    Raises:
        NotCanonical: the payload has no canonical form (NaN or an infinity, an integer no
            IEEE double holds as written, a lone surrogate); a ``ValueError``.
    """
    return canonical_hash(canonical_json(msgspec.to_builtins(payload, str_keys=True)))


def sorted_json(payload: object) -> bytes:
    """The payload as msgspec's compact JSON with sorted keys: the form ``payloadHash``
    covered before RFC 8785 was pinned, still accepted from producers that send it."""
    return _json_sorted.encode(payload)


def canonical_hash(canonical: bytes) -> str:
    """sha256 of payload bytes already serialized (either accepted form), as lowercase hex."""
    return hashlib.sha256(canonical).hexdigest()


def payload_hashes(payload: object) -> frozenset[str]:
    """Every ``payloadHash`` the service accepts for ``payload``: RFC 8785 and the older
    sorted form. Both are fixed functions of the same decoded value, so either proves the
    producer hashed exactly this payload."""
    hashes = {canonical_hash(sorted_json(payload))}
    try:
        hashes.add(payload_hash(payload))
    except NotCanonical:
        pass
    return frozenset(hashes)


def check_result(idempotency_key: str, claimed_hash: str, payload: object, body_len: int) -> bytes:
    """Validate a result submission; return the payload bytes to keep: the form whose sha256
    is ``claimed_hash`` (RFC 8785, or the older sorted form a producer may still send)."""
    if body_len > MAX_RESULT_BODY:
        raise RequestTooLarge(f"result body exceeds {MAX_RESULT_BODY} bytes")
    check_task_key(idempotency_key, "idempotencyKey")
    if not isinstance(claimed_hash, str) or not _HASH_RE.fullmatch(claimed_hash):
        raise InvalidRequest("payloadHash must be 64 lowercase hex characters")
    problem = ""
    try:
        canonical = canonical_json(payload)
        if canonical_hash(canonical) == claimed_hash:
            return canonical
    except NotCanonical as exc:
        problem = f"; the payload has no RFC 8785 form: {exc}"
    legacy = sorted_json(payload)
    if canonical_hash(legacy) == claimed_hash:
        return legacy
    raise InvalidRequest(
        f"payloadHash does not match the payload (sha256 of its RFC 8785 canonical JSON){problem}"
    )


def is_actionable(payload: object) -> bool:
    """notify_if_actionable: a payload is actionable unless it says ``"actionable": false``."""
    return not (isinstance(payload, dict) and payload.get("actionable") is False)

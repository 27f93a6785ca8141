"""Validation rules for claims and results (pure; ``now_ms`` passed in)."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, date, datetime

import msgspec

from .errors import InvalidRequest, RequestTooLarge

MAX_DEADLINE_MS = 30 * 24 * 3600 * 1000
MAX_RESULT_BODY = 256 * 1024
MAX_CLAIM_BODY = 16 * 1024
# fullmatch, not match with "$": "$" also matches before a trailing newline.
_TASK_KEY_RE = re.compile(r"[\x21-\x7e]{1,256}")
_HASH_RE = re.compile(r"[0-9a-f]{64}")
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


def check_task_hash(value: str) -> None:
    check_task_key(value, "taskHash")


def payload_hash(payload: object) -> str:
    """Lowercase hex sha256 of the payload as compact JSON with sorted keys.

    The one definition of ``payloadHash`` (docs/design.md, Contracts: HTTP): the service checks
    results with it and the producer helper computes it for tool servers.
    """
    return canonical_hash(canonical_payload(payload))


def canonical_payload(payload: object) -> bytes:
    """The payload as compact JSON with sorted keys: the bytes ``payloadHash`` covers."""
    return _json_sorted.encode(payload)


def canonical_hash(canonical: bytes) -> str:
    """``payloadHash`` of payload bytes already in canonical form (see :func:`canonical_payload`)."""
    return hashlib.sha256(canonical).hexdigest()


def check_result(idempotency_key: str, claimed_hash: str, payload: object, body_len: int) -> bytes:
    """Validate a result submission; return the canonical payload bytes."""
    if body_len > MAX_RESULT_BODY:
        raise RequestTooLarge(f"result body exceeds {MAX_RESULT_BODY} bytes")
    check_task_key(idempotency_key, "idempotencyKey")
    if not isinstance(claimed_hash, str) or not _HASH_RE.fullmatch(claimed_hash):
        raise InvalidRequest("payloadHash must be 64 lowercase hex characters")
    canonical = canonical_payload(payload)
    if canonical_hash(canonical) != claimed_hash:
        raise InvalidRequest("payloadHash does not match the payload (sha256 of sorted compact JSON)")
    return canonical


def is_actionable(payload: object) -> bool:
    """notify_if_actionable: a payload is actionable unless it says ``"actionable": false``."""
    return not (isinstance(payload, dict) and payload.get("actionable") is False)

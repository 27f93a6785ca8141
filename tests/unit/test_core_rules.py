"""Pure rules of the continuation core: deadlines, result checks, capabilities, errors.

No disk and no server: every function here takes ``now_ms`` or a key and is deterministic.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import msgspec
import pytest
from _claims import make_claim
from hypothesis import given, settings
from hypothesis import strategies as st

from afterword.continuations import InvalidRequest, RequestTooLarge
from afterword.continuations import capabilities as caps
from afterword.continuations.model import Claim, ErrorInfo
from afterword.continuations.rules import (
    MAX_DEADLINE_MS,
    MAX_RESULT_BODY,
    check_result,
    check_task_hash,
    check_task_key,
    format_ms,
    is_actionable,
    parse_deadline,
    payload_hash,
    sorted_json,
)

NOW = int(datetime(2030, 1, 1, tzinfo=UTC).timestamp() * 1000)
DAY = 24 * 3600 * 1000
KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


# -- deadlines -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2030-01-02T00:00:00.000Z", NOW + DAY),
        ("2030-01-02T00:00:00Z", NOW + DAY),
        ("2030-01-02T00:00:00.250+00:00", NOW + DAY + 250),
        ("2030-01-31T00:00:00.000Z", NOW + 30 * DAY),  # exactly 30 days is allowed
        ("2030-01-01T00:00:00.001Z", NOW + 1),
    ],
)
def test_deadline_accepts_rfc3339_utc_within_30_days(text: str, expected: int) -> None:
    assert parse_deadline(text, NOW) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2030-01-01T00:00:00.000Z", "future"),  # == now is not in the future
        ("2029-12-31T23:59:59.999Z", "future"),
        ("2030-01-31T00:00:00.001Z", "30 days"),
        ("2031-01-01T00:00:00.000Z", "30 days"),
        ("2030-01-02T01:00:00.000+01:00", "UTC"),  # same instant as a valid one, but not UTC
        ("2030-01-02T00:00:00.000-00:00", "UTC"),
        ("2030-01-02T00:00:00.000", "UTC"),
        ("2030-01-02T00:00:00.000z", "UTC"),
        ("2030-01-02", "RFC 3339"),
        ("2030-01-02 00:00:00Z", "RFC 3339"),
        ("tomorrow", "RFC 3339"),
        ("", "RFC 3339"),
        ("2030-13-02T00:00:00Z", "RFC 3339"),
        ("2030-01-02T25:00:00Z", "RFC 3339"),
        # ISO 8601 forms that are not RFC 3339 (basic format, week dates, missing seconds).
        ("20300102T000000Z", "RFC 3339"),
        ("2030-W01-3T00:00:00Z", "RFC 3339"),
        ("2030-01-02T00:00Z", "RFC 3339"),
        ("2030-01-02T00Z", "RFC 3339"),
        ("2030-01-02T00:00:00,5Z", "RFC 3339"),
        ("\u0662\u0660\u0663\u0660-01-02T00:00:00Z", "RFC 3339"),  # non-ASCII digits
    ],
)
def test_deadline_rejections(text: str, why: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_deadline(text, NOW)
    assert info.value.status == 400
    assert why in str(info.value)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=MAX_DEADLINE_MS))
def test_deadline_round_trips_through_format_ms(ahead: int) -> None:
    # The claim response echoes expiresAt; it must denote exactly the accepted instant.
    ms = NOW + ahead
    assert parse_deadline(format_ms(ms), NOW) == ms


def test_format_ms_is_rfc3339_utc_with_milliseconds() -> None:
    assert format_ms(NOW + 7) == "2030-01-01T00:00:00.007Z"


def _format_ms_by_datetime(ms: int) -> str:
    """The formatting format_ms replaced (an aware datetime and strftime), as the reference."""
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.integers(min_value=0, max_value=253_402_300_799_999),  # through 9999-12-31
        st.integers(min_value=NOW - 10 * 365 * 86_400_000, max_value=NOW + 10 * 365 * 86_400_000),
        st.sampled_from(
            [0, 999, 86_399_999, 86_400_000, 951_782_399_999, 951_782_400_000, 253_402_300_799_999]
        ),
    )
)
def test_format_ms_gives_the_same_text_as_datetime(ms: int) -> None:
    assert format_ms(ms) == _format_ms_by_datetime(ms)


# -- task keys and hashes --------------------------------------------------------------------
@pytest.mark.parametrize("value", ["k", "stable-task-key", "a" * 256, "!~", "sha256:" + "0" * 64])
def test_task_key_accepts_printable_ascii(value: str) -> None:
    check_task_key(value)
    check_task_hash(value)


@pytest.mark.parametrize("value", ["", "a" * 257, "has space", "tab\tkey", "é", "line\n"])
def test_task_key_rejects(value: str) -> None:
    with pytest.raises(InvalidRequest, match="taskKey"):
        check_task_key(value)
    with pytest.raises(InvalidRequest, match="taskHash"):
        check_task_hash(value)


# -- results ---------------------------------------------------------------------------------
def test_payload_hash_is_sha256_of_sorted_compact_json_without_floats() -> None:
    # RFC 8785 and the older sorted form agree on a payload without floats or astral keys.
    payload = {"b": [1, 2, {"z": None, "a": "é"}], "a": True}
    expected = hashlib.sha256(
        json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ).hexdigest()
    assert payload_hash(payload) == expected
    assert sorted_json(payload) == msgspec.json.encode(payload, order="sorted")


def test_check_result_returns_canonical_bytes() -> None:
    payload = {"summary": "done", "a": 1}
    assert check_result("key-1", payload_hash(payload), payload, 100) == b'{"a":1,"summary":"done"}'


def test_check_result_size_cap() -> None:
    payload = {"x": 1}
    check_result("k", payload_hash(payload), payload, MAX_RESULT_BODY)
    with pytest.raises(RequestTooLarge) as info:
        check_result("k", payload_hash(payload), payload, MAX_RESULT_BODY + 1)
    assert info.value.status == 413


@pytest.mark.parametrize(
    ("key", "claimed", "why"),
    [
        ("k", payload_hash({"x": 2}), "does not match"),
        ("k", payload_hash({"x": 1}).upper(), "lowercase hex"),
        ("k", payload_hash({"x": 1})[:-1], "64"),
        ("k", "sha256-of-the-JSON-payload", "64"),
        ("", payload_hash({"x": 1}), "idempotencyKey"),
        ("has space", payload_hash({"x": 1}), "idempotencyKey"),
    ],
)
def test_check_result_rejections(key: str, claimed: str, why: str) -> None:
    with pytest.raises(InvalidRequest, match=why):
        check_result(key, claimed, {"x": 1}, 10)


def test_actionable_unless_explicitly_false() -> None:
    assert is_actionable({"summary": "x"})
    assert is_actionable({"actionable": True})
    assert is_actionable({"actionable": 0})  # only the JSON literal false suppresses
    assert is_actionable([1, 2])
    assert not is_actionable({"actionable": False})


# -- capabilities ----------------------------------------------------------------------------
def test_continuation_ids_are_deterministic_and_separated() -> None:
    a = caps.continuation_id(KEY, "interactive", "work-control", "task-1")
    assert a == caps.continuation_id(KEY, "interactive", "work-control", "task-1")
    assert a.startswith("c_")
    others = {
        caps.continuation_id(KEY, "detached", "work-control", "task-1"),
        caps.continuation_id(KEY, "interactive", "other", "task-1"),
        caps.continuation_id(KEY, "interactive", "work-control", "task-2"),
        caps.continuation_id(OTHER_KEY, "interactive", "work-control", "task-1"),
    }
    assert a not in others and len(others) == 4


def test_continuation_id_parts_cannot_be_shifted() -> None:
    # A separator between parts: ("a", "b\x00c") must not collide with ("a\x00b", "c").
    assert caps.continuation_id(KEY, "interactive", "ab", "c") != caps.continuation_id(
        KEY, "interactive", "a", "bc"
    )


def test_result_token_verifies_only_for_its_continuation_and_key() -> None:
    token = caps.result_token(KEY, "c_one")
    assert token == caps.result_token(KEY, "c_one")  # restart-stable: derived, not stored
    assert caps.verify_result_token(KEY, "c_one", token)
    assert not caps.verify_result_token(KEY, "c_two", token)
    assert not caps.verify_result_token(OTHER_KEY, "c_one", token)
    tampered = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert not caps.verify_result_token(KEY, "c_one", tampered)
    assert not caps.verify_result_token(KEY, "c_one", "")
    assert not caps.verify_result_token(KEY, "c_one", token + "x")


def test_claim_token_round_trip_and_tampering() -> None:
    token = caps.claim_token(KEY, "cap123")
    assert token.startswith(caps.CLAIM_TOKEN_PREFIX)
    assert caps.parse_claim_token(KEY, token) == "cap123"
    assert caps.parse_claim_token(OTHER_KEY, token) is None
    # Changing the capability id inside an otherwise authentic token fails the MAC.
    assert caps.parse_claim_token(KEY, token.replace("cap123", "cap124")) is None
    assert caps.parse_claim_token(KEY, token[:-2] + "xx") is None
    assert caps.parse_claim_token(KEY, "awc1.") is None
    assert caps.parse_claim_token(KEY, "awc1.nodot") is None
    assert caps.parse_claim_token(KEY, caps.result_token(KEY, "cap123")) is None
    assert caps.parse_claim_token(KEY, "Bearer " + token) is None


def test_operator_token_is_stable_and_key_bound() -> None:
    token = caps.operator_token(KEY)
    assert token == caps.operator_token(KEY)
    assert caps.verify_operator_token(KEY, token)
    assert not caps.verify_operator_token(OTHER_KEY, token)
    assert not caps.verify_operator_token(KEY, token[:-1])
    # Capabilities of different purposes never coincide.
    assert len({token, caps.result_token(KEY, "x"), caps.claim_token(KEY, "x")}) == 3


def test_verify_bearer_exact_match_only() -> None:
    assert caps.verify_bearer("secret-0123456789", "secret-0123456789")
    assert not caps.verify_bearer("secret-0123456789", "secret-012345678")
    assert not caps.verify_bearer("secret-0123456789", "SECRET-0123456789")
    assert not caps.verify_bearer("secret-0123456789", "")


def test_fingerprint_binds_every_part() -> None:
    base = ("run-1", "work-control", "slack:C1:T1#2030-01-01", "slack:C1:T1", "reply")
    fp = caps.fingerprint(*base)
    assert fp == caps.fingerprint(*base)
    assert fp.startswith("sha256:")
    variants = set()
    for i in range(len(base)):
        changed = list(base)
        changed[i] = changed[i] + "x"
        variants.add(caps.fingerprint(*changed))
    variants.add(caps.fingerprint(*base, route="daily"))
    assert fp not in variants and len(variants) == len(base) + 1


def _claim(**changes: object) -> Claim:
    return make_claim(**{"id": "c_1", "created_at_ms": NOW, "deadline_ms": NOW + DAY, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"reply_to": "slack:C2:T9"},
        {"conversation_id": "slack:C1:T1#2030-01-02"},
        {"mode": "capture"},
        {"run_id": "run-2"},
        {"deadline_ms": NOW + 2 * DAY},
        {"task_hash": "other"},
    ],
)
def test_claim_mac_detects_any_altered_field(change: dict[str, object]) -> None:
    claim = _claim()
    mac = caps.claim_mac(KEY, claim)
    assert caps.verify_claim_mac(KEY, claim, mac)
    assert not caps.verify_claim_mac(KEY, _claim(**change), mac)
    assert not caps.verify_claim_mac(OTHER_KEY, claim, mac)


# -- health and bounded errors ---------------------------------------------------------------
def test_error_info_is_bounded() -> None:
    info = ErrorInfo.bounded("c" * 100, "m" * 5000)
    assert len(info.code) == 64 and len(info.message) == 512

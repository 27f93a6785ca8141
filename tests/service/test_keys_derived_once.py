"""Each continuation's result token and claim MAC are derived once per process, not once per
check, and remembering them never lets a wrong token or an altered claim through."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from _claims import make_claim
from fakes.harness import make_config, running

from afterword.app import keys as keys_module
from afterword.app.keys import BoundedCache, ServiceKeys
from afterword.continuations.capabilities import claim_mac, claim_token, result_token
from afterword.continuations.errors import Unauthorized
from afterword.continuations.model import Continuation

pytestmark = pytest.mark.anyio

SECRET = bytes(range(32))
DERIVATIONS = ("result_token", "verify_result_token", "claim_mac", "verify_claim_mac", "parse_claim_token")


@pytest.fixture
def derived(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts every HMAC the service's keys compute, by kind."""
    counts: Counter[str] = Counter()

    def counting(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            counts[name] += 1
            return fn(*args)

        return wrapper

    for name in DERIVATIONS:
        monkeypatch.setattr(keys_module, name, counting(name, getattr(keys_module, name)))
    return counts


def _record(keys: ServiceKeys, **changes: object) -> Continuation:
    claim = make_claim(created_at_ms=1, deadline_ms=10**13, **changes)
    return Continuation(claim=claim, claim_mac=keys.mac(claim))


async def test_a_detached_continuation_derives_its_token_and_mac_once(
    tmp_path: Path, derived: Counter[str]
) -> None:
    config, env = make_config(tmp_path)
    async with running(config, env) as h:
        claimed = await h.producer.detached(config.base_url, "verification", "once")
        assert (await h.producer.submit(claimed, {"summary": "done"})).status_code == 200
        with anyio.fail_after(10):
            while (await h.producer.status(claimed))["state"] != "delivered":
                await anyio.sleep(0.01)
        assert (await h.producer.status(claimed))["state"] == "delivered"
    # Minted once for the claim response; the result's two checks (headers, then the handler),
    # every status read and every worker step reuse it. Without remembering: 1 + 2 + n + ...
    assert derived["result_token"] + derived["verify_result_token"] == 1, derived
    assert derived["claim_mac"] + derived["verify_claim_mac"] == 1, derived


async def test_a_remembered_result_token_still_refuses_every_other_token(derived: Counter[str]) -> None:
    keys = ServiceKeys.derive(SECRET)
    good = keys.result_token("c_a")
    keys.check_result_token("c_a", good)
    for cid, token in [("c_a", good[:-1] + ("A" if good[-1] != "A" else "B")), ("c_a", ""), ("c_b", good)]:
        with pytest.raises(Unauthorized):
            keys.check_result_token(cid, token)
    # A flood of bad tokens for unknown ids is never remembered, so it cannot push out the
    # tokens in use: the good one is still checked without deriving it again.
    for i in range(keys_module.CACHED + 10):
        with pytest.raises(Unauthorized):
            keys.check_result_token(f"c_flood{i}", "awr1.nope")
    before = derived["result_token"] + derived["verify_result_token"]
    keys.check_result_token("c_a", good)
    assert derived["result_token"] + derived["verify_result_token"] == before
    # A fresh process (nothing remembered) accepts the same token by deriving it.
    fresh = ServiceKeys.derive(SECRET)
    fresh.check_result_token("c_a", good)
    assert good == result_token(keys.result, "c_a")


async def test_a_remembered_claim_mac_still_catches_an_altered_claim_or_mac(derived: Counter[str]) -> None:
    keys = ServiceKeys.derive(SECRET)
    rec = _record(keys)
    assert keys.claim_intact(rec)
    copy = msgspec.msgpack.decode(msgspec.msgpack.encode(rec), type=Continuation)  # as replay gives it
    assert copy.claim is not rec.claim and keys.claim_intact(copy)
    assert derived["claim_mac"] == 1 and derived["verify_claim_mac"] == 0
    altered = msgspec.structs.replace(rec, claim=msgspec.structs.replace(rec.claim, task_hash="other"))
    assert not keys.claim_intact(altered)
    assert not keys.claim_intact(msgspec.structs.replace(rec, claim_mac="0" * 64))
    assert not keys.claim_intact(msgspec.structs.replace(rec, claim_mac=rec.claim_mac[:-1]))
    # Another process's keys verify the stored MAC by recomputing it, then remember it.
    other = ServiceKeys.derive(SECRET)
    before = derived["verify_claim_mac"]
    assert other.claim_intact(rec) and other.claim_intact(rec)
    assert derived["verify_claim_mac"] == before + 1
    assert rec.claim_mac == claim_mac(keys.claim_mac, rec.claim)
    assert not ServiceKeys.derive(bytes(32)).claim_intact(rec)  # another state directory's keys


async def test_a_remembered_claim_capability_still_refuses_forgeries(derived: Counter[str]) -> None:
    keys = ServiceKeys.derive(SECRET)
    token = keys.claim_token("cap1")
    assert token == claim_token(keys.claim, "cap1")
    assert keys.claim_capability(token) == "cap1"
    assert derived["parse_claim_token"] == 0
    forged = [
        token[:-1] + ("A" if token[-1] != "A" else "B"),
        token + "x",
        "awc1.cap1",
        "awc1.cap1.",
        token[5:],
        "",
    ]
    for bad in forged:
        assert keys.claim_capability(bad) is None, bad
    fresh = ServiceKeys.derive(SECRET)  # another process: parses once, then remembers
    before = derived["parse_claim_token"]
    assert fresh.claim_capability(token) == "cap1" and fresh.claim_capability(token) == "cap1"
    assert derived["parse_claim_token"] == before + 1


def test_remembered_values_are_bounded_oldest_first() -> None:
    seen: BoundedCache[str, int] = BoundedCache(limit=2)
    for i, key in enumerate("abc"):
        seen.put(key, i)
    assert len(seen) == 2 and seen.get("a") is None and seen.get("b") == 1 and seen.get("c") == 2


def test_keys_never_show_what_they_remember() -> None:
    keys = ServiceKeys.derive(SECRET)
    token = keys.result_token("c_a")
    rec = _record(keys)
    assert token not in repr(keys) and rec.claim_mac not in repr(keys)
    assert keys == ServiceKeys.derive(SECRET)  # what is remembered is no part of equality

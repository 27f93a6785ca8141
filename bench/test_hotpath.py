"""Micro-benchmarks of the per-continuation work cut in issue 20 (docs/performance.md,
"Afterword's own work per continuation"): each group holds the old way and the new way, so a
run gives their ratio under the same load. ``python -m pytest bench/test_hotpath.py``.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime

import anyio
import msgspec
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from afterword.app.keys import ServiceKeys
from afterword.cli.statelog import state_change_line
from afterword.continuations.capabilities import verify_claim_mac, verify_result_token
from afterword.continuations.model import Claim, Continuation
from afterword.continuations.rules import format_ms
from afterword.store import KeyedLocks

SECRET = bytes(range(32))
MS = 1_796_113_567_839
CLAIM = Claim(
    id="c_abcdefghijklmnopqrstuvwx",
    kind="detached",
    server_name="work-control",
    run_id=None,
    conversation_id="local:bench",
    reply_to="local:bench",
    route="bench",
    mode="notify_if_actionable",
    task_key="run-1",
    task_hash="hrun-1",
    deadline_ms=MS + 86_400_000,
    fingerprint="sha256:" + "a" * 32,
    created_at_ms=MS,
)


def _format_ms_by_datetime(ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@pytest.mark.parametrize("way", ["datetime", "arithmetic"])
def test_format_ms(benchmark: BenchmarkFixture, way: str) -> None:
    benchmark.group = "format_ms"
    fn = _format_ms_by_datetime if way == "datetime" else format_ms
    assert benchmark(fn, MS) == "2026-12-01T08:26:07.839Z"


@pytest.mark.parametrize("way", ["derive each time", "remembered"])
def test_result_token_check(benchmark: BenchmarkFixture, way: str) -> None:
    benchmark.group = "result token check"
    keys = ServiceKeys.derive(SECRET)
    token = keys.result_token(CLAIM.id)
    if way == "remembered":
        benchmark(keys.check_result_token, CLAIM.id, token)
    else:
        assert benchmark(verify_result_token, keys.result, CLAIM.id, token)


@pytest.mark.parametrize("way", ["derive each time", "remembered"])
def test_claim_mac_check(benchmark: BenchmarkFixture, way: str) -> None:
    benchmark.group = "claim MAC check"
    keys = ServiceKeys.derive(SECRET)
    rec = Continuation(claim=CLAIM, claim_mac=keys.mac(CLAIM))
    replayed = msgspec.msgpack.decode(msgspec.msgpack.encode(rec), type=Continuation)  # an equal copy
    if way == "remembered":
        assert benchmark(keys.claim_intact, replayed)
    else:
        assert benchmark(verify_claim_mac, keys.claim_mac, replayed.claim, replayed.claim_mac)


def test_hmac_primitive(benchmark: BenchmarkFixture) -> None:
    """One HMAC-SHA256 as the capabilities compute it, for scale."""
    benchmark.group = "result token check"
    benchmark(lambda: hmac.new(SECRET, b"result-token\0" + CLAIM.id.encode(), hashlib.sha256).digest())


@pytest.mark.parametrize("way", ["new lock per key", "no lock object"])
def test_keyed_locks_fresh_keys(benchmark: BenchmarkFixture, way: str) -> None:
    """1,000 holds of keys nobody holds (a transition each), as the worker takes continuations;
    the old way is the same plus the anyio.Lock that hold() used to build for every new key."""
    benchmark.group = "keyed locks, 1000 fresh keys"

    async def holds() -> None:
        locks = KeyedLocks()
        for i in range(1000):
            if way == "new lock per key":
                anyio.Lock(fast_acquire=True)
            async with locks.hold([f"c{i}"]):
                pass

    benchmark(anyio.run, holds)


@pytest.mark.parametrize("way", ["decode (the check kept)", "to_builtins + convert"])
def test_collection_validation(benchmark: BenchmarkFixture, way: str) -> None:
    """Why Collection still decodes what it just encoded: the decode is the cheapest full check
    msgspec offers (convert passes an instance of the target type through unchecked)."""
    benchmark.group = "record validation"
    rec = Continuation(claim=CLAIM, claim_mac="b" * 64, state="synthesizing", updated_at_ms=MS)
    data = msgspec.msgpack.encode(rec)
    decoder = msgspec.msgpack.Decoder(Continuation)
    if way.startswith("decode"):
        assert benchmark(decoder.decode, data) == rec
    else:
        assert benchmark(lambda: msgspec.convert(msgspec.to_builtins(rec), Continuation)) == rec


def test_state_change_line(benchmark: BenchmarkFixture) -> None:
    benchmark.group = "state-change line"
    rec = Continuation(claim=CLAIM, claim_mac="m")
    assert benchmark(state_change_line, None, rec).endswith(b"\n")

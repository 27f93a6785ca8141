"""The store replay's optional C first pass (``afterword/store/_fastreplay.c``) against the
msgspec loop it replaces (``replay._first_pass``): on every log it reads it must leave the
same per-key lsns and the same un-cancelled digest terms, it must read every log afterword
writes, and anything else (other encodings, damaged or random bytes) it must hand back to
msgspec (``None``) rather than judge.

Skipped when the module was not built, except under CI (``CI=true``), where that fails.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from afterword.store import native, replay
from afterword.store.codec import Op, encode_tx
from afterword.wal.frame import FRAME_HEADER_SIZE, encode_frame
from afterword.wal.frames import LogFrames

KEYS = ["a", "b", "c/d", "é/ü"]

op_st = st.builds(
    Op,
    key=st.sampled_from(KEYS),
    value=st.one_of(st.none(), st.binary(max_size=300)),
    blobs=st.lists(st.sampled_from(["b1", "b2", "ß"]), max_size=2).map(tuple),
    prior=st.one_of(st.integers(min_value=0, max_value=12), st.sampled_from([2**16, 2**32, 2**63 - 1])),
)
tx_st = st.lists(op_st, min_size=0, max_size=3).map(lambda ops: encode_tx(tuple(ops)))

# Encodings afterword does not write but msgspec reads or refuses: the C pass must decline.
ODD = [
    msgspec.msgpack.encode([[["a", b"x", []]]]),  # an op without its prior (v3): msgspec reads it
    msgspec.msgpack.encode([[["a", b"x", [], -1]]]),  # negative prior
    msgspec.msgpack.encode([[["a", "text", [], 0]]]),  # a str value: msgspec refuses
    msgspec.msgpack.encode([[["a", b"x", [], 0, 1]]]),  # an extra field: refused
    msgspec.msgpack.encode([[["a", b"x", [], 2**63]]]),
    msgspec.msgpack.encode([[["a", b"x", [1], 0]]]),
    msgspec.msgpack.encode([[[b"a", b"x", [], 0]]]),
    msgspec.msgpack.encode([[]]) + b"\x00",  # trailing bytes
    msgspec.msgpack.encode([[], 1]),
    b"\xa2\xff\xfe",
    b"",
]


def need_c_pass() -> None:
    if native.fast_first_pass is None:
        if os.environ.get("CI") == "true" and os.environ.get("AFTERWORD_PURE_PYTHON_SCAN") != "1":
            pytest.fail("the C replay pass (afterword.store._fastreplay) was not built; CI has a compiler")
        pytest.skip("the C replay pass is not built here")


def _frames(payloads: list[bytes], cuts: set[int]) -> LogFrames:
    """Payloads as the log hands them over, in several buffers (split before each cut)."""
    frames = LogFrames(5)
    data = b""
    for i, payload in enumerate(payloads):
        if i in cuts or i == 0:
            if i:
                frames.runs[-1] = frames.runs[-1]._replace(data=data)
            data = b"\x11" * (8 * i)
            frames.start_run(data)
        at = len(data)
        data += encode_frame(7, 5 + i, 5, payload)
        frames.spans.extend((at + FRAME_HEADER_SIZE, at + FRAME_HEADER_SIZE + len(payload)))
    if payloads:
        frames.runs[-1] = frames.runs[-1]._replace(data=data)
    return frames


def _python(frames: LogFrames) -> tuple[dict[str, int], list[Any]] | type[Exception]:
    last: dict[str, int] = {}
    try:
        return last, replay._first_pass(frames, last)
    except Exception as exc:
        return type(exc)


def _c(frames: LogFrames) -> tuple[dict[str, int], list[Any]] | None:
    assert native.fast_first_pass is not None
    last: dict[str, int] = {}
    odd = native.fast_first_pass(list(frames.by_run()), frames.first_lsn, last)
    return None if odd is None else (last, odd)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=st.lists(tx_st, max_size=8), cuts=st.sets(st.integers(min_value=1, max_value=7), max_size=3))
def test_c_pass_reads_every_log_afterword_writes_as_msgspec_does(payloads: list[bytes], cuts: set[int]) -> None:
    need_c_pass()
    frames = _frames(payloads, cuts)
    got = _c(frames)
    assert got is not None
    assert got == _python(frames)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payloads=st.lists(tx_st, min_size=1, max_size=5),
    victim=st.integers(min_value=0, max_value=4),
    damage=st.one_of(
        st.tuples(st.just("flip"), st.integers(min_value=0, max_value=400), st.integers(min_value=0, max_value=7)),
        st.tuples(st.just("cut"), st.integers(min_value=0, max_value=400), st.just(0)),
        st.tuples(st.just("odd"), st.integers(min_value=0, max_value=len(ODD) - 1), st.just(0)),
        st.tuples(st.just("random"), st.integers(min_value=0, max_value=2**32), st.just(0)),
    ),
)
def test_c_pass_declines_or_agrees_on_anything_else(
    payloads: list[bytes], victim: int, damage: tuple[str, int, int]
) -> None:
    """Damaged or foreign transactions: either the C pass declines (msgspec then decides),
    or msgspec reads them too and both give the same result."""
    need_c_pass()
    kind, at, bit = damage
    victim %= len(payloads)
    raw = bytearray(payloads[victim])
    if kind == "flip" and raw:
        raw[at % len(raw)] ^= 1 << bit
    elif kind == "cut":
        del raw[at % (len(raw) + 1) :]
    elif kind == "odd":
        raw = bytearray(ODD[at])
    elif kind == "random":
        raw = bytearray(at.to_bytes(5, "little") * (1 + at % 7))
    payloads[victim] = bytes(raw)
    frames = _frames(payloads, {2})
    got = _c(frames)
    if got is not None:
        assert got == _python(frames)


def test_c_pass_declines_each_foreign_encoding() -> None:
    need_c_pass()
    for payload in ODD:
        assert _c(_frames([encode_tx((Op("z", b"1"),)), payload], set())) is None, payload

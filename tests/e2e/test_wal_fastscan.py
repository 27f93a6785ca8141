"""The optional C frame scan (``afterword/wal/_fastscan.c``) against the Python loop it
replaces: the same payload spans, the same stopping point and the same replay plan, on
valid, torn, bit-flipped and shadow-bearing segments; and the pure-Python path still works on
its own.

The C module is built by ``pip install -e .`` when a compiler is present. Without it these
differential tests skip, except under CI (``CI=true``), where a missing build is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from afterword.wal import SegmentImage, frame, native, scan_chain
from afterword.wal.frame import (
    SEGMENT_HEADER_SIZE,
    SegmentHeader,
    decode_frame_at,
    encode_frame,
    encode_segment_header,
    find_aligned_py,
    read_spans,
    read_spans_py,
)
from afterword.wal.shadow import encode_shadow

ROOT = Path(__file__).resolve().parents[2]
SEG = 4096


def need_c_scan() -> None:
    if native.fast_read_spans is None:
        if os.environ.get("CI") == "true" and os.environ.get("AFTERWORD_PURE_PYTHON_SCAN") != "1":
            pytest.fail("the C scan (afterword.wal._fastscan) was not built; CI has a compiler")
        pytest.skip("the C scan is not built here")


@st.composite
def segments(draw: st.DrawFn) -> tuple[bytes, int, list[int]]:
    """A segment image (header, batches of frames, the last batch's shadow), then damaged
    (torn, bit-flipped, zeroed) or not; returns it, its salt and its frames' offsets."""
    salt = draw(st.integers(min_value=0, max_value=2**64 - 1))
    first = draw(st.integers(min_value=1, max_value=2**40))
    buf = bytearray(SEG)
    buf[:SEGMENT_HEADER_SIZE] = encode_segment_header(SegmentHeader(1, salt, first))
    pos, lsn, offsets = SEGMENT_HEADER_SIZE, first, []
    batches = draw(st.lists(st.lists(st.binary(max_size=120), min_size=1, max_size=4), max_size=6))
    for n, batch in enumerate(batches):
        start, frames, batch_start = pos, b"", lsn
        for payload in batch:
            offsets.append(start + len(frames))
            frames += encode_frame(salt, lsn, batch_start, payload)
            lsn += 1
        parts = [frames]
        if n == len(batches) - 1 and draw(st.booleans()):
            parts += encode_shadow(salt, start, lsn - len(batch), lsn - 1, frames)
        data = b"".join(parts)
        if start + len(data) > SEG:
            break
        buf[start : start + len(data)] = data
        pos = start + len(frames)
    damage = draw(st.sampled_from(["none", "flip", "tear", "zero"]))
    if damage == "flip":
        at = draw(st.integers(min_value=SEGMENT_HEADER_SIZE, max_value=SEG - 1))
        buf[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
    elif damage == "tear":
        buf = buf[: draw(st.integers(min_value=SEGMENT_HEADER_SIZE, max_value=SEG))]
    elif damage == "zero":
        at = draw(st.integers(min_value=SEGMENT_HEADER_SIZE, max_value=SEG - 1))
        end = at + draw(st.integers(min_value=1, max_value=64))
        buf[at:end] = bytes(len(buf[at:end]))
    return bytes(buf), salt, offsets


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seg=segments(),
    start_at=st.integers(min_value=0, max_value=30),
    lsn_shift=st.sampled_from([0, 0, 0, 1, -1]),
    max_payload=st.sampled_from([1024, 1024, 60, 0]),
)
def test_c_scan_gives_the_python_scans_spans(
    seg: tuple[bytes, int, list[int]], start_at: int, lsn_shift: int, max_payload: int
) -> None:
    need_c_scan()
    data, salt, offsets = seg
    header_first = int.from_bytes(data[24:32], "little")
    offset, expect = SEGMENT_HEADER_SIZE, header_first
    if offsets and start_at:
        k = start_at % len(offsets)
        offset, expect = offsets[k], header_first + k
    expect = max(0, expect + lsn_shift)
    py_out: array[int] = array("q")
    py_end = read_spans_py(data, offset, salt, expect, max_payload, py_out)
    c_offset, c_expect, packed = native.fast_read_spans(
        data, offset, salt, expect, max_payload, xxhash.xxh3_64_intdigest
    )
    assert (c_offset, c_expect) == py_end
    c_out: array[int] = array("q")
    c_out.frombytes(packed)
    assert c_out == py_out
    # Each span is a whole frame's payload, in order (what decode_frame_at reads there).
    for i, (start, end) in enumerate(zip(py_out[::2], py_out[1::2], strict=True)):
        decoded = decode_frame_at(data, start - 32, salt, max_payload)
        assert decoded is not None and decoded.payload == data[start:end] and decoded.lsn == expect + i


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seg=segments())
def test_replay_plan_is_the_same_with_and_without_the_c_scan(seg: tuple[bytes, int, list[int]]) -> None:
    need_c_scan()
    data, _salt, _ = seg
    images = [SegmentImage(0, data)]

    def plan() -> object:
        try:
            return scan_chain(images, start_seq=1, checkpoint_lsn=int.from_bytes(data[24:32], "little") - 1,
                              max_payload=1024)
        except Exception as exc:  # the same refusal either way
            return (type(exc), str(exc))

    with_c = plan()
    saved = frame.fast_read_spans, frame.fast_find_aligned
    frame.fast_read_spans = frame.fast_find_aligned = None
    try:
        without = plan()
    finally:
        frame.fast_read_spans, frame.fast_find_aligned = saved
    assert with_c == without


@settings(max_examples=300, deadline=None)
@given(
    pattern=st.sampled_from([b"LAWSHDW\x01", b"\x01\x02\x03\x04", b"\x00\x00\x00\x00", b"ab"]),
    size=st.integers(min_value=0, max_value=300),
    at=st.lists(st.integers(min_value=0, max_value=300), max_size=5),
    start=st.integers(min_value=0, max_value=320),
    filler=st.sampled_from([b"\x00", b"\x01", b"L"]),
)
def test_c_aligned_search_finds_what_the_python_search_finds(
    pattern: bytes, size: int, at: list[int], start: int, filler: bytes
) -> None:
    need_c_scan()
    buf = bytearray(filler * size)
    for pos in at:
        buf[pos : pos + len(pattern)] = pattern
    data = bytes(buf)
    assert native.fast_find_aligned(data, pattern, start) == find_aligned_py(data, pattern, start)


def test_read_spans_uses_the_python_loop_when_the_c_scan_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    salt = 0x1234_5678_9ABC_DEF1
    data = bytearray(SEG)
    data[:SEGMENT_HEADER_SIZE] = encode_segment_header(SegmentHeader(1, salt, 7))
    frames = encode_frame(salt, 7, 7, b"one") + encode_frame(salt, 8, 7, b"two")
    data[SEGMENT_HEADER_SIZE : SEGMENT_HEADER_SIZE + len(frames)] = frames
    calls: list[int] = []

    def spy(*args: object) -> tuple[int, int]:
        calls.append(1)
        return read_spans_py(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(frame, "fast_read_spans", None)
    monkeypatch.setattr(frame, "fast_find_aligned", None)
    monkeypatch.setattr("afterword.wal.frame.read_spans_py", spy)
    image = bytes(data)
    out: array[int] = array("q")
    end = read_spans(image, SEGMENT_HEADER_SIZE, salt, 7, 1024, out)
    assert calls == [1]
    assert [image[a:b] for a, b in zip(out[::2], out[1::2], strict=True)] == [b"one", b"two"]
    assert end == (SEGMENT_HEADER_SIZE + len(frames), 9)


def test_c_scan_passes_on_a_failing_checksum_call() -> None:
    """An error inside the hash call ends the scan with that error (nothing leaks or is
    returned half-done)."""
    need_c_scan()
    salt = 0x1234_5678_9ABC_DEF1
    data = bytearray(SEG)
    data[:SEGMENT_HEADER_SIZE] = encode_segment_header(SegmentHeader(1, salt, 7))
    one = encode_frame(salt, 7, 7, b"one")
    data[SEGMENT_HEADER_SIZE : SEGMENT_HEADER_SIZE + len(one)] = one

    def broken(_data: bytes, _seed: int) -> int:
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        native.fast_read_spans(bytes(data), SEGMENT_HEADER_SIZE, salt, 7, 1024, broken)
    with pytest.raises(TypeError):
        native.fast_read_spans(bytes(data), SEGMENT_HEADER_SIZE, salt, 7, 1024, lambda _d, _s: "x")


def test_a_store_opens_and_replays_on_the_pure_python_scan(tmp_path: Path) -> None:
    """AFTERWORD_PURE_PYTHON_SCAN=1 (as on a machine without a compiler): no C module is
    loaded, and a store written and reopened replays its log the same."""
    script = (
        "import sys\n"
        "from afterword.store import RecordStore, Put\n"
        "from afterword.wal import native\n"
        "assert native.fast_read_spans is None and native.fast_find_aligned is None\n"
        "from afterword.store import native as store_native\n"
        "assert store_native.fast_first_pass is None\n"
        "s = RecordStore.open(sys.argv[1])\n"
        "for i in range(50): s.transact_sync([Put(f'k/{i % 7}', b'v%d' % i)])\n"
        "s.close()\n"
        "s = RecordStore.open(sys.argv[1])\n"
        "print(s.replayed, sorted((r.key, r.value) for r in s.items()))\n"
        "s.close()\n"
    )
    env = {**os.environ, "AFTERWORD_PURE_PYTHON_SCAN": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "state")], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    expected = sorted((f"k/{k}", b"v%d" % max(i for i in range(50) if i % 7 == k)) for k in range(7))
    assert done.stdout.strip() == f"50 {expected}"

"""Replay at open (``CommittedState.replay``) is one pass that hashes only the digest terms
that do not cancel; it must leave exactly the state and the evidence that the definition
leaves, operation by operation (``_step`` below: subtract the prior's hash, add the put's,
then ``CommittedState.apply``), including for logs that do not match the records (wrong
priors, skipped after-images, unread catalogued records). Watchers subscribe after it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import afterword
from afterword.store.catalog import CatalogEntry
from afterword.store.codec import Op, RecordImage, decode_tx, encode_tx
from afterword.store.evidence import ReplayCheck
from afterword.store.memory import CommittedState
from afterword.store.types import Record
from afterword.wal.layout import FRAME_HEADER_SIZE, Frame, encode_frame
from afterword.wal.log_frames import LogFrames, Run

KEYS = ["a", "b", "c/d"]
BLOBS = ["b1", "b2"]

op_st = st.builds(
    Op,
    key=st.sampled_from(KEYS),
    value=st.one_of(st.none(), st.binary(max_size=4)),
    blobs=st.lists(st.sampled_from(BLOBS), max_size=2).map(tuple),
    prior=st.integers(min_value=0, max_value=12),
)
# (record files read at open, catalogued unread records); versions up to the checkpoint (4)
loaded_st = st.dictionaries(st.sampled_from(KEYS), st.integers(min_value=1, max_value=4), max_size=3)


def _state(files: dict[str, int], catalogued: dict[str, int]) -> CommittedState:
    state = CommittedState()
    records = {k: RecordImage(k, lsn, b"v", ("b1",) if lsn % 2 else ()) for k, lsn in files.items()}
    entries = [CatalogEntry(k, lsn, ("b2",)) for k, lsn in catalogued.items() if k not in files]
    if entries:
        state.load_catalog(entries, records, lambda wanted: [])
    else:
        state.load(records)
    return state


def _in_runs(frames: list[Frame], cuts: set[int]) -> LogFrames:
    """``frames`` as the log hands them over: spans into several buffers (segments), split
    before each index in ``cuts``."""
    out = LogFrames(frames[0].lsn if frames else 0)
    bounds = [i for i in sorted({0, *cuts}) if i < len(frames)] + [len(frames)]
    for lo, hi in itertools.pairwise(bounds):
        data = b"\xee" * (8 * lo)  # each buffer its own offsets
        for f in frames[lo:hi]:
            at = len(data)
            data += encode_frame(1, f.lsn, f.batch_start, f.payload)
            out.spans.extend((at + FRAME_HEADER_SIZE, at + FRAME_HEADER_SIZE + len(f.payload)))
        out.runs.append(Run(lo, data, 0))
    return out


def _check(state: CommittedState, digest: str, count: int) -> ReplayCheck:
    return ReplayCheck(
        records_path="records",
        checkpoint_lsn=2,
        digest=digest,
        count=count,
        loaded={key: rec.lsn for key, rec in state.records.items()},
    )


def _step(state: CommittedState, check: ReplayCheck, frames: list[Frame]) -> None:
    """What replay means, one operation at a time."""
    for frame in frames:
        ops = decode_tx(frame.payload).ops
        for op in ops:
            if check.expected is not None:
                if op.prior:
                    check.expected.remove(op.key, op.prior)
                if op.value is not None:
                    check.expected.add(op.key, frame.lsn)
            if op.value is not None:
                check.newer.discard((op.key, frame.lsn))
        state.apply(frame.lsn, ops)


@settings(max_examples=300, deadline=None)
@given(
    files=loaded_st,
    catalogued=loaded_st,
    txs=st.lists(st.lists(op_st, min_size=1, max_size=3), max_size=8),
    start=st.integers(min_value=1, max_value=6),
    manifest_off=st.booleans(),
    cuts=st.sets(st.integers(min_value=1, max_value=7), max_size=3),
)
def test_replay_matches_the_operation_by_operation_definition(
    files: dict[str, int],
    catalogued: dict[str, int],
    txs: list[list[Op]],
    start: int,
    manifest_off: bool,
    cuts: set[int],
) -> None:
    frames = [Frame(0, start + i, start + i, encode_tx(tuple(ops)), 0) for i, ops in enumerate(txs)]
    step, fused = _state(files, catalogued), _state(files, catalogued)
    digest = "" if manifest_off else step.digest.text()
    step_check, fused_check = (
        _check(step, digest, step.digest.count),
        _check(fused, digest, fused.digest.count),
    )

    _step(step, step_check, frames)
    fused.replay(_in_runs(frames, cuts), fused_check)  # as the log hands them over

    assert fused.digest == step.digest
    assert fused_check.expected == step_check.expected
    assert fused_check.newer == step_check.newer
    assert fused.records == step.records
    assert fused.unread == step.unread
    assert fused.dirty == step.dirty
    assert +fused.blob_refs == +step.blob_refs


def test_replay_runs_before_any_watcher_subscribes() -> None:
    """The step-by-step path that told watchers of each replayed change is gone: a state
    that has a watcher refuses to replay."""
    state = CommittedState()
    state.watch("", lambda key, old, new: None)
    frames = [Frame(0, 1, 1, encode_tx((Op("a", b"x"),)), 0)]
    with pytest.raises(AssertionError, match="watchers subscribe after replay"):
        state.replay(frames, _check(state, state.digest.text(), 0))
    assert state.records == {}


def test_a_watcher_subscribing_after_replay_is_told_the_replayed_records() -> None:
    state = CommittedState()
    frames = [
        Frame(0, 1, 1, encode_tx((Op("a", b"x"), Op("b", b"y"))), 0),
        Frame(0, 2, 2, encode_tx((Op("a", None, prior=1),)), 0),
        Frame(0, 3, 3, encode_tx((Op("b", b"z", prior=1),)), 0),
    ]
    check = _check(state, state.digest.text(), 0)
    state.replay(frames, check)
    check.finish(state.digest)
    seen: list[tuple[str, Record | None, int | None]] = []
    state.watch("", lambda key, old, new: seen.append((key, old, new and new.lsn)))
    assert seen == [("b", None, 3)]


def test_replay_has_one_implementation_and_it_is_python() -> None:
    """No compiled replay beside this one: no C source in the package, no switch to choose."""
    package = Path(afterword.__file__).parent
    assert sorted(p.name for p in package.rglob("*.c")) == []
    assert not any("AFTERWORD_PURE_PYTHON_SCAN" in p.read_text() for p in package.rglob("*.py"))

"""Replay at open (``CommittedState.replay``) is one fused loop that hashes each (key, version)
once; it must leave exactly the state and the evidence that the step-by-step path leaves
(``ReplayCheck.op`` per operation, then ``CommittedState.apply``), including for logs that do
not match the records (wrong priors, skipped after-images, unread catalogued records)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from afterword.store import native
from afterword.store.catalog import CatalogEntry
from afterword.store.codec import Op, RecordImage, decode_tx, encode_tx
from afterword.store.evidence import ReplayCheck
from afterword.store.memory import CommittedState
from afterword.wal.frame import FRAME_HEADER_SIZE, Frame, encode_frame
from afterword.wal.frames import LogFrames, Run

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


@settings(max_examples=150, deadline=None)
@given(
    files=loaded_st,
    catalogued=loaded_st,
    txs=st.lists(st.lists(op_st, min_size=1, max_size=3), max_size=8),
    start=st.integers(min_value=1, max_value=6),
    manifest_off=st.booleans(),
    cuts=st.sets(st.integers(min_value=1, max_value=7), max_size=3),
    c_pass=st.booleans(),
)
def test_fused_replay_matches_step_by_step(
    files: dict[str, int],
    catalogued: dict[str, int],
    txs: list[list[Op]],
    start: int,
    manifest_off: bool,
    cuts: set[int],
    c_pass: bool,
) -> None:
    frames = [Frame(0, start + i, start + i, encode_tx(tuple(ops)), 0) for i, ops in enumerate(txs)]
    step, fused = _state(files, catalogued), _state(files, catalogued)
    digest = "" if manifest_off else step.digest.text()
    step_check, fused_check = _check(step, digest, step.digest.count), _check(fused, digest, fused.digest.count)

    for frame in frames:
        ops = decode_tx(frame.payload).ops
        for op in ops:
            step_check.op(frame.lsn, op.key, op.value is not None, op.prior)
        step.apply(frame.lsn, ops)
    saved = native.fast_first_pass
    if not c_pass:
        native.fast_first_pass = None  # the msgspec pass (as without a compiler)
    try:
        fused.replay(_in_runs(frames, cuts), fused_check)  # as the log hands them over
    finally:
        native.fast_first_pass = saved

    assert fused.digest == step.digest
    assert fused_check.expected == step_check.expected
    assert fused_check.newer == step_check.newer
    assert fused.records == step.records
    assert fused.unread == step.unread
    assert fused.dirty == step.dirty
    assert +fused.blob_refs == +step.blob_refs


def test_fused_replay_tells_watchers_like_apply() -> None:
    seen: list[tuple[str, int | None, int | None]] = []
    state = CommittedState()
    state.watch("", lambda key, old, new: seen.append((key, old and old.lsn, new and new.lsn)))
    frames = [Frame(0, 1, 1, encode_tx((Op("a", b"x"),)), 0), Frame(0, 2, 2, encode_tx((Op("a", None, prior=1),)), 0)]
    state.replay(frames, _check(state, state.digest.text(), 0))
    assert seen == [("a", None, 1), ("a", 1, None)]

"""Recovery composes with a ``SegmentLog`` instead of being one (issue 34, point 3):
``recover`` brings a bare ``SegmentLog`` to the end of the log on disk through its public
surface, and writing goes on from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from afterword.disk import StateRoot
from afterword.wal import WalOptions
from afterword.wal.errors import WalCorruptError
from afterword.wal.recovery import recover
from afterword.wal.segments import SegmentLog

OPTIONS = WalOptions(segment_size=64 * 1024, max_payload=24 * 1024)


def _reopen(root: StateRoot) -> tuple[SegmentLog, list[bytes]]:
    segments = SegmentLog(root, "wal", OPTIONS)
    frames = recover(segments, start_seq=1, checkpoint_lsn=0, named=[], acked_lsn=0, before_free=None)
    return segments, [f.payload for f in frames]


def test_recover_brings_a_bare_segment_log_to_the_end_of_the_log(tmp_path: Path) -> None:
    root = StateRoot(str(tmp_path / "state"))
    segments, payloads = _reopen(root)
    assert payloads == [] and segments.durable_lsn == 0
    big = b"x" * 20_000  # a few writes per segment, so the log spans several lives
    items = [(lsn, big if lsn % 2 else b"small %d" % lsn) for lsn in range(1, 13)]
    for item in items:
        segments.write_batch([item])
    segments.close()

    segments, payloads = _reopen(root)
    assert payloads == [p for _, p in items]
    assert segments.durable_lsn == 12
    assert len(segments.live_segments(1)) > 1  # several lives, resumed as one chain
    segments.write_batch([(13, b"after the reopen")])  # the tail resumes where the log ended
    segments.close()

    segments, payloads = _reopen(root)
    assert payloads == [p for _, p in items] + [b"after the reopen"]
    segments.close()


def test_recover_refuses_a_log_that_skips_lsns_and_changes_nothing(tmp_path: Path) -> None:
    root = StateRoot(str(tmp_path / "state"))
    segments, _ = _reopen(root)
    segments.write_batch([(1, b"one")])
    segments.close()
    wal = tmp_path / "state" / "wal"
    before = sorted(p.read_bytes() for p in wal.iterdir())
    segments = SegmentLog(root, "wal", OPTIONS)
    with pytest.raises(WalCorruptError):
        recover(segments, start_seq=1, checkpoint_lsn=5, named=[], acked_lsn=0, before_free=None)
    segments.close()
    assert sorted(p.read_bytes() for p in wal.iterdir()) == before

"""Issue 34, point 3: the log is composed, not a class chain split across files.

``WriteAheadLog`` (group commit) holds a ``SegmentLog`` (slots, chain, tail, the batch write);
an open fills the segments through ``adopt_slot``/``resume``. The invariants the group-commit
layer relies on are asserted where they hold.
"""

from __future__ import annotations

import pytest

from afterword.disk import StateRoot
from afterword.wal import WalOptions, WriteAheadLog
from afterword.wal.layout import SEGMENT_HEADER_SIZE, SegmentHeader
from afterword.wal.segments import SegmentLog

OPTIONS = WalOptions(segment_size=64 * 1024, max_payload=1024, zero_fill=False)


def test_the_log_holds_its_segments_instead_of_inheriting_them() -> None:
    assert not issubclass(WriteAheadLog, SegmentLog)
    assert WriteAheadLog.__mro__ == (WriteAheadLog, object)


def test_a_batch_must_continue_the_log(state_dir: str) -> None:
    segments = SegmentLog(StateRoot(state_dir), "wal", OPTIONS)
    segments.root.ensure_dir("wal")
    segments.write_batch([(1, b"one")])
    with pytest.raises(AssertionError, match="lsn 3 after 1"):
        segments.write_batch([(3, b"a hole at 2")])
    with pytest.raises(AssertionError, match="contiguous"):
        segments.write_batch([(2, b"two"), (4, b"four")])
    assert segments.durable_lsn == 1 and segments.root.failed is None  # nothing was written
    segments.close()


def test_resume_refuses_a_view_that_cannot_be_the_disk(state_dir: str) -> None:
    wal, _ = WriteAheadLog.open(StateRoot(state_dir), start_seq=1, checkpoint_lsn=0, options=OPTIONS)
    wal.append_sync(b"x")
    wal.roll()
    wal.append_sync(b"y")  # two segment lives: slots 0 and 1
    wal.close()
    segments = SegmentLog(StateRoot(state_dir), "wal", OPTIONS)
    root = segments.root
    for slot in (0, 1):
        segments.adopt_slot(
            slot, root.open_file(segments.slot_rel(slot), writable=True), OPTIONS.segment_size
        )
    with pytest.raises(AssertionError, match="adopted twice"):
        segments.adopt_slot(0, segments.slot_handle(0), OPTIONS.segment_size)
    first, second = SegmentHeader(1, 7, 1), SegmentHeader(2, 9, 2)
    with pytest.raises(AssertionError, match="repeat"):
        segments.resume({0: first, 1: first}, next_seq=2, durable_lsn=2, tail=None)
    with pytest.raises(AssertionError, match="not past the chain"):
        segments.resume({0: first, 1: second}, next_seq=2, durable_lsn=2, tail=None)
    with pytest.raises(AssertionError, match="not the chain's last"):
        segments.resume({0: first, 1: second}, next_seq=3, durable_lsn=2, tail=(0, SEGMENT_HEADER_SIZE))
    with pytest.raises(AssertionError):
        segments.resume({0: first, 1: second}, next_seq=3, durable_lsn=2, tail=(1, SEGMENT_HEADER_SIZE + 3))
    segments.resume({0: first, 1: second}, next_seq=3, durable_lsn=2, tail=(1, SEGMENT_HEADER_SIZE + 40))
    assert [s.slot for s in segments.live_segments(1)] == [0, 1]
    assert segments.end_tail() == 3  # the next write starts life 3
    segments.close()

"""``open_readonly``: the committed state of a directory, read without locking or writing.

Operator tools use it beside a running host, so it must never change a byte, must leave out
a torn tail instead of cutting it, and must fail closed on the same damage as a real open.
"""

from __future__ import annotations

import os
import threading

import pytest
from _disk_helpers import SMALL, abandon, snapshot
from _highwater import mark_back

from afterword.disk import UnsafeStateError
from afterword.store import Put, RecordStore, StoreCorruptError, open_readonly
from afterword.wal.layout import SEGMENT_HEADER_SIZE, decode_frame_at, decode_segment_header


def _fill(path: str, n: int, *, checkpoint_after: int | None = None, killed: bool = False) -> None:
    store = RecordStore.open(path, options=SMALL)
    for i in range(n):
        store.transact_sync([Put(f"k:{i}", f"v{i}".encode())])
        if checkpoint_after is not None and i + 1 == checkpoint_after:
            store.checkpoint_sync()
    if killed:
        abandon(store)
    else:
        store.close()


def test_missing_directory_is_refused_and_not_created(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "nope")
    with pytest.raises(UnsafeStateError) as err:
        open_readonly(path)
    assert err.value.rule == "missing"
    assert not os.path.exists(path)


def test_reads_records_and_log_without_changing_anything(tmp_path: object) -> None:
    path = str(tmp_path)
    _fill(path, 6, checkpoint_after=3)
    before = snapshot(path)
    with open_readonly(path, options=SMALL) as view:
        assert {r.key: r.value for r in view.items()} == {f"k:{i}": f"v{i}".encode() for i in range(6)}
        assert view.lsn == 6 and view.manifest.checkpoint_lsn == 3
        assert view.secret is not None and len(view.secret) == 32
        assert view.latest_version("k:5") == 6 and "k:0" in view and len(view) == 6
    assert snapshot(path) == before


def test_reads_beside_an_owner_holding_the_lock(tmp_path: object) -> None:
    path = str(tmp_path)
    with RecordStore.open(path, options=SMALL) as store:
        store.transact_sync([Put("a", b"1")])
        view = open_readonly(path, options=SMALL)
        assert view.get("a") is not None and view.get("a").value == b"1"  # type: ignore[union-attr]
        store.transact_sync([Put("a", b"2")])
    assert open_readonly(path, options=SMALL).get("a").value == b"2"  # type: ignore[union-attr]


def test_torn_tail_is_left_out_not_cut(tmp_path: object) -> None:
    path = str(tmp_path)
    _fill(path, 3, killed=True)  # no clean close: nothing records lsn 3 as acknowledged
    mark_back(path, 2)  # ... nor the HIGHWATER mark: killed before marking it
    seg = os.path.join(path, "wal", "00000000.seg")
    data = _flip_last_frame(seg)
    with open(seg, "r+b") as fh:
        # ... and the shadow behind its write: a torn final write, which is cut.
        fh.seek(len(data.rstrip(b"\x00")) - 1)
        fh.write(b"\xff")
    before = snapshot(path)
    view = open_readonly(path, options=SMALL)
    assert view.lsn == 2 and view.get("k:2") is None and view.get("k:1") is not None
    assert snapshot(path) == before  # no .broken copy, nothing zeroed
    assert len(data) > SEGMENT_HEADER_SIZE


def _flip_last_frame(seg: str) -> bytes:
    """Flip a payload byte of the segment's last frame; return the bytes before."""
    with open(seg, "r+b") as fh:
        data = fh.read()
    header = decode_segment_header(data)
    assert header is not None
    offset, last = SEGMENT_HEADER_SIZE, None
    while (frame := decode_frame_at(data, offset, header.salt, len(data))) is not None:
        last, offset = frame, frame.end
    assert last is not None
    with open(seg, "r+b") as fh:
        fh.seek(last.offset + 33)
        fh.write(bytes([data[last.offset + 33] ^ 0x04]))
    return data


def test_damaged_last_frame_with_a_whole_shadow_is_read_from_the_shadow(tmp_path: object) -> None:
    path = str(tmp_path)
    _fill(path, 3, killed=True)
    seg = os.path.join(path, "wal", "00000000.seg")
    _flip_last_frame(seg)
    before = snapshot(path)
    view = open_readonly(path, options=SMALL)
    assert view.lsn == 3 and view.get("k:2") is not None
    assert snapshot(path) == before  # read-only: the restore is left to the owner's open


def test_damage_fails_closed_as_a_real_open_does(tmp_path: object) -> None:
    path = str(tmp_path)
    _fill(path, 3, checkpoint_after=3)
    rec = os.path.join(path, "records", os.listdir(os.path.join(path, "records"))[0])
    with open(rec, "r+b") as fh:
        fh.write(b"garbage!")
    with pytest.raises(StoreCorruptError):
        open_readonly(path, options=SMALL, attempts=1)
    # A real open reads the checkpoint catalog and refuses the record when it is first read.
    with pytest.raises(StoreCorruptError), RecordStore.open(path, options=SMALL) as store:
        list(store.items())


def test_consistent_reads_while_a_writer_commits_and_checkpoints(tmp_path: object) -> None:
    """Each read shows a state the writer really had: both keys move together."""
    path = str(tmp_path)
    stop = threading.Event()
    with RecordStore.open(path, options=SMALL) as store:
        store.transact_sync([Put("a", b"0"), Put("b", b"0")])

        def writer() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                store.transact_sync([Put("a", str(i).encode()), Put("b", str(i).encode())])
                if i % 7 == 0:
                    store.checkpoint_sync()

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            seen = []
            for _ in range(40):
                view = open_readonly(path, options=SMALL)
                a, b = view.get("a"), view.get("b")
                assert a is not None and b is not None and a.value == b.value
                seen.append(int(a.value))
        finally:
            stop.set()
            thread.join()
    assert seen == sorted(seen)

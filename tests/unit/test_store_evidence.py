"""Issue 14: damaged, missing or rolled-back state fails closed instead of opening as less.

Each test damages a state directory the way an operator, a disk or a bad restore might, and
checks that the open (and the read-only open) refuses with an error naming the path and the
rule, where the v3 store opened with acknowledged records silently missing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from _disk_helpers import SMALL, abandon
from _highwater import mark_back, reseal_manifest

from afterword.store import FORMAT, Put, RecordStore, StoreCorruptError, open_readonly
from afterword.store.evidence import EvidenceError
from afterword.wal import Frame, WalCorruptError, WalEvidenceError
from afterword.wal.layout import SEGMENT_HEADER_SIZE, decode_frame_at, decode_segment_header

Rule = tuple[type[Exception], str]


def _make(path: str, *, before: int = 3, after: int = 4, killed: bool = True) -> dict[str, bytes]:
    """``before`` commits, a checkpoint, ``after`` more commits; the acknowledged state."""
    store = RecordStore.open(path, options=SMALL)
    acked: dict[str, bytes] = {}
    for i in range(before + after):
        store.transact_sync([Put(f"k:{i}", f"v{i}".encode())])
        acked[f"k:{i}"] = f"v{i}".encode()
        if i + 1 == before:
            store.checkpoint_sync()
    if killed:
        abandon(store)
    else:
        store.close()
    return acked


def _refused(path: str, rule: str) -> Exception:
    with pytest.raises((EvidenceError, WalEvidenceError)) as err:
        RecordStore.open(path, options=SMALL)
    assert err.value.rule == rule, err.value  # type: ignore[union-attr]
    assert path in str(err.value)
    with pytest.raises((EvidenceError, WalEvidenceError)) as err2:
        open_readonly(path, options=SMALL, attempts=1)
    assert err2.value.rule == rule  # type: ignore[union-attr]
    return err.value


def _segments(path: str) -> list[str]:
    wal = os.path.join(path, "wal")
    return sorted(os.path.join(wal, n) for n in os.listdir(wal) if n.endswith(".seg"))


def _tail_segment(path: str) -> str:
    manifest = json.loads(Path(os.path.join(path, "MANIFEST")).read_bytes())
    slot = max(manifest["segments"], key=lambda ref: ref[1])[0]
    return os.path.join(path, "wal", f"{slot:08d}.seg")


def _truncate(size: int):  # type: ignore[no-untyped-def]
    def damage(seg: str) -> None:
        os.truncate(seg, size)

    return damage


def _garble(seg: str) -> None:
    with open(seg, "r+b") as fh:
        fh.write(os.urandom(4096))


def _zero_header(seg: str) -> None:
    with open(seg, "r+b") as fh:
        fh.write(b"\0" * SEGMENT_HEADER_SIZE)


@pytest.mark.parametrize(
    ("damage", "rule"),
    [
        (os.unlink, "segment_missing"),
        (_truncate(0), "segment_short"),
        (_truncate(100), "segment_short"),
        (_truncate(SMALL.wal.segment_size // 2), "segment_short"),
        (_garble, "segment_replaced"),
        (_zero_header, "segment_replaced"),
    ],
    ids=["deleted", "truncated-0", "truncated-100", "truncated-half", "garbage", "header-zeroed"],
)
def test_damaged_tail_segment_fails_closed_naming_its_rule(tmp_path: object, damage, rule: str) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path)
    _make(path)
    damage(_tail_segment(path))
    _refused(path, rule)


def test_refused_open_sweeps_no_record_file(tmp_path: object) -> None:
    path = str(tmp_path)
    _make(path)
    os.unlink(_tail_segment(path))
    records = sorted(os.listdir(os.path.join(path, "records")))
    _refused(path, "segment_missing")
    assert sorted(os.listdir(os.path.join(path, "records"))) == records


def test_deleted_record_file_fails_closed(tmp_path: object) -> None:
    path = str(tmp_path)
    _make(path)
    rec_dir = os.path.join(path, "records")
    os.unlink(os.path.join(rec_dir, sorted(os.listdir(rec_dir))[0]))
    _refused(path, "record_digest")


def test_record_file_rolled_back_to_an_older_version_fails_closed(tmp_path: object) -> None:
    path = str(tmp_path)
    with RecordStore.open(path, options=SMALL) as store:
        store.transact_sync([Put("a", b"1")])
        store.checkpoint_sync()
        name = os.path.join(path, "records", sorted(os.listdir(os.path.join(path, "records")))[0])
        old = Path(name).read_bytes()
        store.transact_sync([Put("a", b"2")])
        store.checkpoint_sync()
    with open(name, "wb") as fh:
        fh.write(old)
    # The checkpoint catalog lets an open skip reading record files, so a file rewritten in
    # place is refused when the record is first read (never served), with the same rule.
    with RecordStore.open(path, options=SMALL) as store, pytest.raises(EvidenceError) as err:
        store.get("a")
    assert err.value.rule == "record_digest" and name in str(err.value)
    # Without the catalog (or read-only, which reads every file) the open itself refuses.
    with pytest.raises(EvidenceError) as err2:
        open_readonly(path, options=SMALL, attempts=1)
    assert err2.value.rule == "record_digest"
    os.unlink(os.path.join(path, "CATALOG"))
    _refused(path, "record_digest")


def test_deleted_secret_fails_closed_and_is_not_recreated(tmp_path: object) -> None:
    path = str(tmp_path)
    _make(path)
    os.unlink(os.path.join(path, "secret"))
    _refused(path, "secret_missing")
    assert not os.path.exists(os.path.join(path, "secret"))


def test_replaced_secret_fails_closed(tmp_path: object) -> None:
    path = str(tmp_path)
    _make(path)
    fd = os.open(os.path.join(path, "secret"), os.O_WRONLY | os.O_TRUNC)
    os.write(fd, os.urandom(32))
    os.close(fd)
    _refused(path, "secret_mismatch")


@pytest.mark.parametrize(
    ("fields", "mark_too", "rule"),
    [
        (("checkpoint_lsn",), False, "acknowledged_lost"),
        # The HIGHWATER mark still records lsn 5 as acknowledged (issue 29).
        (("checkpoint_lsn", "acked_lsn"), False, "high_water_lost"),
        (("checkpoint_lsn", "acked_lsn"), True, "manifest_behind_records"),
    ],
)
def test_manifest_checkpoint_lsn_edited_back_fails_closed(
    tmp_path: object, fields: tuple[str, ...], mark_too: bool, rule: str
) -> None:
    path = str(tmp_path)
    _make(path, before=5, after=0, killed=False)
    assert json.loads(Path(path, "MANIFEST").read_bytes())["checkpoint_lsn"] == 5

    def edit(manifest: dict[str, object]) -> None:
        for name in fields:
            manifest[name] = 0

    reseal_manifest(path, edit)  # a forger who recomputes the checksum (test_manifest_checksum)
    if mark_too:
        mark_back(path, 0)
    _refused(path, rule)


def test_manifest_restored_from_an_earlier_copy_fails_closed(tmp_path: object) -> None:
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    store.transact_sync([Put("a", b"1")])
    store.checkpoint_sync()
    early = Path(os.path.join(path, "MANIFEST")).read_bytes()
    for i in range(3):
        store.transact_sync([Put("a", str(i).encode()), Put(f"b:{i}", b"x")])
        store.checkpoint_sync()
    store.close()
    with open(os.path.join(path, "MANIFEST"), "wb") as fh:
        fh.write(early)
    with pytest.raises((StoreCorruptError, WalCorruptError)):
        RecordStore.open(path, options=SMALL)
    with pytest.raises((StoreCorruptError, WalCorruptError)):
        open_readonly(path, options=SMALL, attempts=1)


def _flip(seg: str, offset: int, bit: int = 0) -> None:
    with open(seg, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ (1 << bit)]))


def _last_frame(path: str) -> tuple[str, Frame]:
    seg = _tail_segment(path)
    data = Path(seg).read_bytes()
    header = decode_segment_header(data)
    assert header is not None
    offset, frame = SEGMENT_HEADER_SIZE, None
    while (nxt := decode_frame_at(data, offset, header.salt, len(data))) is not None:
        frame, offset = nxt, nxt.end
    assert frame is not None
    return seg, frame


# Byte offsets of a frame's fields: marker, length, lsn, batch_start, checksum, payload.
FIELDS = {"marker": 0, "length": 5, "lsn": 8, "batch_start": 16, "checksum": 24, "payload": 33}


@pytest.mark.parametrize("killed", [True, False], ids=["killed", "clean-stop"])
@pytest.mark.parametrize("field", FIELDS)
def test_flipped_bit_in_the_acknowledged_last_frame_is_restored_from_its_shadow(
    tmp_path: object, field: str, killed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The last frame of a log is written after the last MANIFEST write: only its write's
    shadow copy can tell a flipped bit from a torn write, and it restores the frame."""
    path = str(tmp_path)
    acked = _make(path, killed=killed)
    seg, frame = _last_frame(path)
    _flip(seg, frame.offset + FIELDS[field], 6)
    with (
        caplog.at_level(logging.WARNING, logger="afterword.wal"),
        RecordStore.open(path, options=SMALL) as store,
    ):
        assert {r.key: r.value for r in store.items()} == acked
    assert any("restored lsn" in r.getMessage() for r in caplog.records)
    assert not any("cut a torn tail" in r.getMessage() for r in caplog.records)
    assert [n for n in os.listdir(os.path.join(path, "wal")) if ".broken." in n]
    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="afterword.wal"),
        RecordStore.open(path, options=SMALL) as store,
    ):
        assert {r.key: r.value for r in store.items()} == acked  # the primary was rewritten
    assert not caplog.records


def test_last_frame_and_its_shadow_both_damaged_after_a_clean_stop_fails_closed(tmp_path: object) -> None:
    path = str(tmp_path)
    _make(path, killed=False)  # a clean stop records the last acknowledged lsn
    seg, frame = _last_frame(path)
    _flip(seg, frame.offset + FIELDS["payload"])
    _flip(seg, frame.end + 8)  # the shadow behind the write
    _refused(path, "acknowledged_lost")
    assert not [n for n in os.listdir(os.path.join(path, "wal")) if ".broken." in n]


def test_torn_unacknowledged_tail_is_cut_and_the_cut_is_logged(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path)
    acked = _make(path, killed=True)
    seg, frame = _last_frame(path)
    # A write that never completed: its frame is damaged, no whole shadow proves it reached
    # the disk and the HIGHWATER mark never recorded it, so it was never acknowledged and
    # may be cut.
    mark_back(path, frame.lsn - 1)
    _flip(seg, frame.offset + FIELDS["payload"])
    _flip(seg, frame.end + 8)
    with (
        caplog.at_level(logging.WARNING, logger="afterword.wal"),
        RecordStore.open(path, options=SMALL) as store,
    ):
        got = {r.key: r.value for r in store.items()}
    assert got == {k: v for k, v in acked.items() if k != "k:6"}
    assert any("cut a torn tail" in r.getMessage() for r in caplog.records)
    assert [n for n in os.listdir(os.path.join(path, "wal")) if ".broken." in n]


def test_damaged_shadow_alone_is_harmless(tmp_path: object, caplog: pytest.LogCaptureFixture) -> None:
    path = str(tmp_path)
    acked = _make(path, killed=True)
    seg, frame = _last_frame(path)
    _flip(seg, frame.end + 8)
    with (
        caplog.at_level(logging.WARNING, logger="afterword.wal"),
        RecordStore.open(path, options=SMALL) as store,
    ):
        assert {r.key: r.value for r in store.items()} == acked
    assert not caplog.records
    assert not [n for n in os.listdir(os.path.join(path, "wal")) if ".broken." in n]


def test_manifest_missing_beside_a_log_fails_closed(tmp_path: object) -> None:
    path = str(tmp_path)
    _make(path, before=0, after=3)
    os.unlink(os.path.join(path, "MANIFEST"))
    shutil.rmtree(os.path.join(path, "records"))
    os.mkdir(os.path.join(path, "records"), 0o700)
    _refused(path, "manifest_missing")


def test_v3_state_is_upgraded_on_first_open(tmp_path: object) -> None:
    """Today's v3 files: the first open replays them, then checkpoints into a v4 MANIFEST."""
    path = str(tmp_path)
    acked = _make(path, killed=True)
    mpath = os.path.join(path, "MANIFEST")
    manifest = json.loads(Path(mpath).read_bytes())
    v3 = {
        k: manifest[k]
        for k in ("generation", "checkpoint_lsn", "wal_start_seq", "record_count", "guard_required", "meta")
    }
    v3["format"] = "per-record-v3"
    with open(mpath, "w") as fh:
        json.dump(v3, fh)
    os.unlink(os.path.join(path, "HIGHWATER"))  # no v3 build wrote one
    with RecordStore.open(path, options=SMALL) as store:
        assert {r.key: r.value for r in store.items()} == acked
        assert store.manifest.format == FORMAT
    after = json.loads(Path(mpath).read_bytes())
    assert after["format"] == FORMAT and after["record_digest"] and after["checkpoint_lsn"] == 7
    # The upgraded directory now carries the evidence.
    os.unlink(os.path.join(path, "records", sorted(os.listdir(os.path.join(path, "records")))[0]))
    _refused(path, "record_digest")


def test_clean_state_reopens_exactly_many_times(tmp_path: object) -> None:
    path = str(tmp_path)
    acked = _make(path, killed=False)
    for round_ in range(3):
        with RecordStore.open(path, options=SMALL) as store:
            assert {r.key: r.value for r in store.items()} == acked
            store.transact_sync([Put(f"r:{round_}", b"x")])
            acked[f"r:{round_}"] = b"x"
            if round_ == 1:
                store.checkpoint_sync()
    assert {r.key: r.value for r in open_readonly(path, options=SMALL).items()} == acked

"""Issue 29 (points 1, 6, 7): a log rolled back, cut or zeroed, and a MANIFEST edited, are
refused instead of opening as less; a torn, never-acknowledged write still opens.

Before the HIGHWATER mark, nothing but the last write's shadow vouched for the log written
since the last MANIFEST write: a segment copied back from an older copy after a kill, or its
last writes zeroed, opened with acknowledged transactions gone (delivered results back at
``claimed``). A segment cut while the service ran went unnoticed until the restart, and a
MANIFEST with a lowered ``acked_lsn`` opened silently.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from _disk_helpers import SMALL, abandon
from _highwater import current_mark, mark_back

from afterword.cli.doctor import diagnose, render
from afterword.disk import DiskFailedError, UnsafeStateError
from afterword.store import Put, RecordStore, open_readonly
from afterword.store.evidence import EvidenceError
from afterword.wal import WalEvidenceError
from afterword.wal.layout import SEGMENT_HEADER_SIZE, decode_frame_at, decode_segment_header

SEG = os.path.join("wal", "00000000.seg")


def _commit(store: RecordStore, first: int, count: int) -> dict[str, bytes]:
    done: dict[str, bytes] = {}
    for i in range(first, first + count):
        store.transact_sync([Put(f"k:{i}", f"v{i}".encode())])
        done[f"k:{i}"] = f"v{i}".encode()
    return done


def _refused(path: str, rule: str, names: str) -> None:
    """Both opens (serve's and the doctor's read-only one) refuse, naming the evidence."""
    for opener in (
        lambda: RecordStore.open(path, options=SMALL),
        lambda: open_readonly(path, options=SMALL, attempts=1),
    ):
        with pytest.raises((EvidenceError, WalEvidenceError)) as err:
            opener()
        assert err.value.rule == rule, err.value  # type: ignore[union-attr]
        assert err.value.path == os.path.join(path, names)  # type: ignore[union-attr]


def _writes(data: bytes) -> list[int]:
    """Offsets where each write (group commit) of the segment's frames begins."""
    header = decode_segment_header(data)
    assert header is not None
    starts: list[int] = []
    offset = SEGMENT_HEADER_SIZE
    while (frame := decode_frame_at(data, offset, header.salt, len(data))) is not None:
        if frame.lsn == frame.batch_start:
            starts.append(frame.offset)
        offset = frame.end
    return starts


# -- point 1: the log cannot roll back without the HIGHWATER mark noticing -----------------


def test_segment_copied_back_after_a_kill_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    _commit(store, 0, 3)
    older = Path(path, SEG).read_bytes()
    _commit(store, 3, 2)  # two more acknowledged (two results delivered)
    abandon(store)  # SIGKILL
    Path(path, SEG).write_bytes(older)
    _refused(path, "high_water_lost", "HIGHWATER")
    d = diagnose(path)
    assert not d.healthy and d.rule == "high_water_lost"
    assert "rolled back" in render(d)


@pytest.mark.parametrize("writes", [1, 3, 20, 300])
def test_last_writes_zeroed_after_a_kill_are_refused(tmp_path: Path, writes: int) -> None:
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    _commit(store, 0, writes + 5)
    abandon(store)
    seg = Path(path, SEG)
    data = seg.read_bytes()
    start = _writes(data)[-writes]
    seg.write_bytes(data[:start] + bytes(len(data) - start))  # frames and shadow zeroed
    _refused(path, "high_water_lost", "HIGHWATER")


def test_a_torn_write_that_was_never_acknowledged_still_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The mark is written only after the segment's fdatasync: a write killed before it was
    marked was never acknowledged, and when its bytes are torn it is cut, not refused."""
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    acked = _commit(store, 0, 4)
    assert store.wal.high_water is not None
    assert current_mark(path).lsn == 4

    def killed_before_the_mark(lsn: int, check: int) -> None:
        raise OSError("killed")

    monkeypatch.setattr(store.wal.high_water, "record", killed_before_the_mark)
    with pytest.raises(OSError):
        store.transact_sync([Put("k:torn", b"never acknowledged")])
    abandon(store)
    assert current_mark(path).lsn == 4
    seg = Path(path, SEG)
    data = seg.read_bytes()
    start = _writes(data)[-1]
    torn = start + 40  # the frame's header and a few payload bytes reached the disk
    seg.write_bytes(data[:torn] + bytes(len(data) - torn))
    with (
        caplog.at_level(logging.WARNING, logger="afterword.wal"),
        RecordStore.open(path, options=SMALL) as store,
    ):
        assert {r.key: r.value for r in store.items()} == acked
        store.transact_sync([Put("k:after", b"x")])
    assert any("cut a torn tail" in r.getMessage() for r in caplog.records)
    with RecordStore.open(path, options=SMALL) as store:
        assert store.get("k:after") is not None and store.get("k:torn") is None


def test_a_durable_write_killed_before_its_mark_opens_with_it(tmp_path: Path) -> None:
    """Durable but never acknowledged: keeping it is as right as cutting it would be."""
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    _commit(store, 0, 4)
    abandon(store)
    mark_back(path, 3)
    with RecordStore.open(path, options=SMALL) as store:
        assert store.get("k:3") is not None
        store.transact_sync([Put("k:4", b"x")])
    assert current_mark(path).lsn == 5


def test_another_transaction_at_the_marked_lsn_is_refused(tmp_path: Path) -> None:
    """A copy of the same segment life with other frames at the acknowledged lsn."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    os.chmod(tmp_path, 0o700)
    store = RecordStore.open(a, options=SMALL)
    _commit(store, 0, 3)
    store.close()
    shutil.copytree(a, b)
    for path, value in ((a, b"acknowledged"), (b, b"other")):
        store = RecordStore.open(path, options=SMALL)
        store.transact_sync([Put("k:x", value)])
        abandon(store)
    Path(a, SEG).write_bytes(Path(b, SEG).read_bytes())
    _refused(a, "high_water_mismatch", "HIGHWATER")


@pytest.mark.parametrize(
    ("damage", "rule"),
    [("delete", "high_water_missing"), ("other", "high_water_replaced"), ("garbage", "high_water_damaged")],
)
def test_high_water_file_damage_is_refused(tmp_path: Path, damage: str, rule: str) -> None:
    path, other = str(tmp_path / "s"), str(tmp_path / "o")
    os.chmod(tmp_path, 0o700)
    for p in (path, other):
        store = RecordStore.open(p, options=SMALL)
        _commit(store, 0, 3)
        abandon(store)
    hw = Path(path, "HIGHWATER")
    if damage == "delete":
        hw.unlink()
    elif damage == "other":
        hw.write_bytes(Path(other, "HIGHWATER").read_bytes())
    else:
        hw.write_bytes(os.urandom(len(hw.read_bytes())))
    _refused(path, rule, "HIGHWATER")


def test_state_from_before_the_mark_gets_one_on_open(tmp_path: Path) -> None:
    """A directory written before HIGHWATER (and MANIFEST checksums) existed opens as it
    did; the open seals its MANIFEST and starts a mark, which protects it from then on."""
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    acked = _commit(store, 0, 3)
    abandon(store)
    mpath = Path(path, "MANIFEST")
    fields = json.loads(mpath.read_bytes())
    for name in ("high_water", "checksum"):
        del fields[name]
    mpath.write_text(json.dumps(fields))
    Path(path, "HIGHWATER").unlink()
    assert open_readonly(path, options=SMALL).lsn == 3
    with RecordStore.open(path, options=SMALL) as store:
        assert {r.key: r.value for r in store.items()} == acked
        assert store.manifest.checksum and store.manifest.high_water
        older = Path(path, SEG).read_bytes()
        acked |= _commit(store, 3, 2)
        abandon(store)
    assert current_mark(path).lsn == 5
    Path(path, SEG).write_bytes(older)
    _refused(path, "high_water_lost", "HIGHWATER")


# -- point 7: the MANIFEST carries a checksum -----------------------------------------------


def test_lowered_acked_lsn_in_the_manifest_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    _commit(store, 0, 5)
    store.close()  # a clean stop records acked_lsn 5
    mpath = Path(path, "MANIFEST")
    text = mpath.read_text()
    assert '"acked_lsn":5' in text
    mpath.write_text(text.replace('"acked_lsn":5', '"acked_lsn":1'))
    _refused(path, "manifest_checksum", "MANIFEST")
    assert diagnose(path).rule == "manifest_checksum"


def test_manifest_stripped_of_its_checksum_beside_a_mark_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    _commit(store, 0, 2)
    store.close()
    mpath = Path(path, "MANIFEST")
    fields = json.loads(mpath.read_bytes())
    fields["checksum"] = ""
    mpath.write_text(json.dumps(fields))
    _refused(path, "manifest_checksum", "MANIFEST")


# -- point 6: a segment cut while serving --------------------------------------------------


def test_segment_truncated_while_serving_refuses_the_next_write(tmp_path: Path) -> None:
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    _commit(store, 0, 3)
    os.truncate(os.path.join(path, SEG), 1 << 20)  # past the data: nothing lost yet
    with pytest.raises(UnsafeStateError) as err:
        store.transact_sync([Put("k:after-cut", b"x")])
    assert err.value.rule == "size_changed"
    problem = store.storage_problem()
    assert problem is not None and problem[0] == "disk_failed"
    with pytest.raises(DiskFailedError):
        store.transact_sync([Put("k:later", b"x")])
    abandon(store)


def test_doctor_says_which_lsns_a_cut_keeps_and_the_repair_that_keeps_them(tmp_path: Path) -> None:
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    acked = _commit(store, 0, 6)
    abandon(store)
    seg = os.path.join(path, SEG)
    size = os.path.getsize(seg)
    os.truncate(seg, 1 << 16)  # the cut leaves every frame
    d = diagnose(path)
    assert d.rule == "segment_short"
    assert "lsns 1-6 read whole" in d.restore and "every acknowledged transaction" in d.restore
    assert f"truncate -s {size} {seg}" in d.restore
    os.truncate(seg, size)  # the repair the doctor names
    assert diagnose(path).healthy
    with RecordStore.open(path, options=SMALL) as store:
        assert {r.key: r.value for r in store.items()} == acked


def test_doctor_says_which_acknowledged_lsns_a_deeper_cut_took(tmp_path: Path) -> None:
    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    _commit(store, 0, 6)
    abandon(store)
    seg = os.path.join(path, SEG)
    os.truncate(seg, _writes(Path(seg).read_bytes())[4])  # lsns 5 and 6 cut away
    d = diagnose(path)
    assert d.rule == "segment_short"
    assert "lsns 1-4 read whole" in d.restore and "lsns 5-6 were acknowledged" in d.restore
    assert "Restore the whole state directory" in d.restore


@pytest.mark.anyio
async def test_the_service_refuses_the_first_result_after_its_segment_was_cut(tmp_path: Path) -> None:
    """The issue's scenario: with the segment cut while serving, the next write is refused
    and health says ``disk_failed``, instead of twenty more acknowledged results. (The write
    that finds the cut answers 500, as one that finds a replaced segment does; every write
    after it is the documented 503 ``disk_failed``.)"""
    from _service import DETACHED_TOKEN, deadline
    from fakes.harness import make_config, running

    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:

        async def claim(key: str) -> int:
            answer = await h.producer.client.post(
                f"{config.base_url}/v1/continuations/detached/claim",
                headers={
                    "Authorization": f"Bearer {DETACHED_TOKEN}",
                    "X-Mono-Agent-Service-Name": "work-control",
                },
                json={
                    "route": "verification",
                    "taskKey": key,
                    "taskHash": "h-" + key,
                    "deadline": deadline(),
                },
            )
            if answer.status_code == 503:
                assert answer.json()["error"]["code"] == "disk_failed", answer.text
            return answer.status_code

        assert await claim("t-1") == 200
        os.truncate(os.path.join(config.state_dir, SEG), 1 << 20)
        assert await claim("t-2") != 200
        assert [await claim(f"t-{i}") for i in range(3, 6)] == [503, 503, 503]
        health = h.service.continuation_health()
        assert health.status == "unhealthy" and health.causes[0].code == "disk_failed"


def test_doctor_cli_no_longer_says_a_rolled_back_log_opens_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's report: after the copy-back, ``doctor`` said "opens cleanly" (exit 0)."""
    from afterword.cli import main

    path = str(tmp_path)
    store = RecordStore.open(path, options=SMALL)
    _commit(store, 0, 3)
    older = Path(path, SEG).read_bytes()
    _commit(store, 3, 2)
    abandon(store)
    Path(path, SEG).write_bytes(older)
    assert main(["continuations", "doctor", "--state-dir", path]) == 2
    out = capsys.readouterr().out
    assert "opens cleanly" not in out and "high_water_lost" in out and "HIGHWATER" in out

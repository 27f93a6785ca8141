"""The checkpoint catalog (issue 20, store open): an open reads one catalog instead of every
record file, reads a record's bytes when it is first asked for, and still fails closed on
every kind of damage the record files can suffer; a catalog that cannot be used is ignored."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from _disk_helpers import SMALL, abandon

from afterword.disk import OsDisk
from afterword.store import FORMAT, Delete, Put, RecordStore, StoreCorruptError, StoreOptions, open_readonly
from afterword.store.catalog import CATALOG, decode_catalog
from afterword.store.codec import RecordImage, encode_record, record_file_name
from afterword.store.evidence import EvidenceError
from afterword.wal import WalOptions

MiB = 1024 * 1024


class CountingDisk(OsDisk):
    """Counts the files opened under ``records/``."""

    def __init__(self) -> None:
        self.record_opens = 0

    def open(self, path: str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
        if path.endswith(".rec"):
            self.record_opens += 1
        return super().open(path, flags, mode, dir_fd=dir_fd)


def _build(path: str, n: int = 20, *, blobs: bool = False) -> dict[str, bytes]:
    """``n`` records checkpointed, then a few changes only the log holds (a kill)."""
    store = RecordStore.open(path, options=SMALL)
    state: dict[str, bytes] = {}
    for i in range(n):
        refs = (f"{i:064x}",) if blobs and i % 3 == 0 else ()
        store.transact_sync([Put(f"r:{i}", f"value {i}".encode(), refs)])
        state[f"r:{i}"] = f"value {i}".encode()
    store.checkpoint_sync()
    store.transact_sync([Put("r:1", b"changed"), Delete("r:2"), Put("r:new", b"new")])
    state.update({"r:1": b"changed", "r:new": b"new"})
    del state["r:2"]
    abandon(store)
    return state


def _rec(path: str, key: str) -> str:
    return os.path.join(path, "records", record_file_name(key))


def test_checkpoint_writes_a_catalog_the_manifest_names(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    os.chmod(tmp_path, 0o700)
    _build(path)
    manifest = json.loads(Path(path, "MANIFEST").read_bytes())
    assert manifest["format"] == FORMAT == "per-record-v5" and len(manifest["catalog"]) == 32
    body = decode_catalog(Path(path, CATALOG).read_bytes())
    assert body.checkpoint_lsn == manifest["checkpoint_lsn"]
    assert sorted(e.key for e in body.entries) == sorted(f"r:{i}" for i in range(20))


def test_open_reads_records_only_when_asked(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    os.chmod(tmp_path, 0o700)
    state = _build(path, blobs=True)
    disk = CountingDisk()
    with RecordStore.open(path, disk=disk, options=SMALL) as store:
        assert disk.record_opens == 0  # catalog plus log: no record file read at open
        assert store.statistics().unread == 18  # 20 catalogued, r:1 and r:2 replaced by replay
        assert len(store) == len(state) and "r:5" in store and "r:2" not in store
        assert store.latest_version("r:7") is not None and disk.record_opens == 0
        assert store.referenced_blobs() == {f"{i:064x}" for i in range(0, 20, 3)}
        assert store.get("r:5").value == b"value 5"  # type: ignore[union-attr]
        assert disk.record_opens == 1
        assert {r.key: r.value for r in store.items()} == state
        assert store.statistics().unread == 0
        # A replaced unread record leaves the digest and blob counts right for the next
        # checkpoint's evidence.
        store.transact_sync([Put("r:3", b"over"), Delete("r:6")])
        store.checkpoint_sync()
    state.update({"r:3": b"over"})
    del state["r:6"]
    with RecordStore.open(path, options=SMALL) as store:
        store.transact_sync([Put("r:9", b"nine"), Delete("r:12")])  # replaces unread records
        store.checkpoint_sync()
    state.update({"r:9": b"nine"})
    del state["r:12"]
    with RecordStore.open(path, options=SMALL) as store:
        assert {r.key: r.value for r in store.items()} == state
        assert store.referenced_blobs() == {f"{i:064x}" for i in range(0, 20, 3) if i not in (3, 6, 9, 12)}
    view = open_readonly(path, options=SMALL)
    assert {k: r.value for k, r in view.records.items()} == state


def test_deleted_record_file_fails_closed_at_open(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    os.chmod(tmp_path, 0o700)
    _build(path)
    os.unlink(_rec(path, "r:7"))
    with pytest.raises(EvidenceError) as err:
        RecordStore.open(path, options=SMALL)
    assert err.value.rule == "record_digest" and record_file_name("r:7") in str(err.value)


def test_deleted_file_of_a_record_the_log_rewrites_opens_exactly(tmp_path: Path) -> None:
    """The log holds a newer version of r:1 and the delete of r:2: their files do not matter."""
    path = str(tmp_path / "s")
    os.chmod(tmp_path, 0o700)
    state = _build(path)
    os.unlink(_rec(path, "r:1"))
    os.unlink(_rec(path, "r:2"))
    with RecordStore.open(path, options=SMALL) as store:
        assert {r.key: r.value for r in store.items()} == state


@pytest.mark.parametrize("damage", ["garbage", "truncate", "older"])
def test_damaged_record_file_fails_closed_when_read(tmp_path: Path, damage: str) -> None:
    path = str(tmp_path / "s")
    os.chmod(tmp_path, 0o700)
    _build(path)
    target = _rec(path, "r:8")
    if damage == "older":
        # A version of r:8's file from before the checkpoint recorded it (a bad restore).
        other = RecordStore.open(str(tmp_path / "old"), options=SMALL)
        other.transact_sync([Put("r:8", b"stale")])
        other.checkpoint_sync()
        other.close()
        data = Path(_rec(str(tmp_path / "old"), "r:8")).read_bytes()
    else:
        data = Path(target).read_bytes()
        data = os.urandom(len(data)) if damage == "garbage" else data[: len(data) // 2]
    Path(target).write_bytes(data)
    with RecordStore.open(path, options=SMALL) as store:
        assert store.get("r:9") is not None  # undamaged records still read
        with pytest.raises(StoreCorruptError, match="r:8|" + record_file_name("r:8")):
            store.get("r:8")
        with pytest.raises(StoreCorruptError):
            list(store.items("r:"))
    with pytest.raises(StoreCorruptError):
        open_readonly(path, options=SMALL, attempts=1)  # the read-only open reads every file


@pytest.mark.parametrize("damage", ["delete", "garbage", "other"])
def test_unusable_catalog_is_ignored_and_every_file_read(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "s")
    os.chmod(tmp_path, 0o700)
    state = _build(path)
    catalog = Path(path, CATALOG)
    if damage == "delete":
        catalog.unlink()
    elif damage == "garbage":
        catalog.write_bytes(os.urandom(catalog.stat().st_size))
    else:  # a well-formed catalog of another checkpoint (as a crash before the MANIFEST leaves)
        with RecordStore.open(str(tmp_path / "o"), options=SMALL) as other:
            other.transact_sync([Put("x", b"y")])
            other.checkpoint_sync()
        catalog.write_bytes(Path(tmp_path, "o", CATALOG).read_bytes())
    disk = CountingDisk()
    with (
        caplog.at_level(logging.WARNING, logger="afterword.store"),
        RecordStore.open(path, disk=disk, options=SMALL) as store,
    ):
        assert store.statistics().unread == 0 and disk.record_opens == 20
        assert {r.key: r.value for r in store.items()} == state
        store.checkpoint_sync()  # the next checkpoint writes a good catalog again
    assert "reading every record file instead" in caplog.text
    disk = CountingDisk()
    with RecordStore.open(path, disk=disk, options=SMALL) as store:
        assert disk.record_opens == 0 and {r.key: r.value for r in store.items()} == state


def test_catalog_does_not_hide_a_deleted_file_when_unusable(tmp_path: Path) -> None:
    """Without the catalog the evidence rules apply to the files exactly as in v4."""
    path = str(tmp_path / "s")
    os.chmod(tmp_path, 0o700)
    _build(path)
    Path(path, CATALOG).unlink()
    os.unlink(_rec(path, "r:7"))
    with pytest.raises(EvidenceError) as err:
        RecordStore.open(path, options=SMALL)
    assert err.value.rule == "record_digest"


def test_files_of_a_cut_short_checkpoint_are_read_and_checked(tmp_path: Path) -> None:
    """A checkpoint killed after its record files but before its MANIFEST: the old catalog
    does not list the new file, which is read at open and must be reproduced by replay."""
    path = str(tmp_path / "s")
    os.chmod(tmp_path, 0o700)
    state = _build(path)
    store = RecordStore.open(path, options=SMALL)
    store.transact_sync([Put("r:late", b"late")])
    state["r:late"] = b"late"
    saved = {n: Path(path, n).read_bytes() for n in ("MANIFEST", CATALOG)}
    store.checkpoint_sync()
    abandon(store)
    for name, data in saved.items():  # as if the kill came before the catalog and MANIFEST
        Path(path, name).write_bytes(data)
    with RecordStore.open(path, options=SMALL) as store:
        assert {r.key: r.value for r in store.items()} == state
    # A file the catalog does not list and the log does not explain is damage.
    store = RecordStore.open(path, options=SMALL)
    store.close()
    stray = _rec(path, "r:zzz")
    Path(stray).write_bytes(encode_record(RecordImage("r:zzz", 3, b"planted")))
    os.chmod(stray, 0o600)
    with pytest.raises(EvidenceError) as err:
        RecordStore.open(path, options=SMALL)
    assert err.value.rule == "record_digest"


def test_v4_state_gets_a_catalog_on_first_open(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    os.chmod(tmp_path, 0o700)
    state = _build(path)
    mpath = Path(path, "MANIFEST")
    manifest = json.loads(mpath.read_bytes())
    for name in ("catalog", "high_water", "checksum"):  # v5 fields a v4 build never wrote
        del manifest[name]
    manifest["format"] = "per-record-v4"
    mpath.write_text(json.dumps(manifest))
    Path(path, CATALOG).unlink()
    Path(path, "HIGHWATER").unlink()
    with RecordStore.open(path, options=SMALL) as store:
        assert store.manifest.format == FORMAT and store.manifest.catalog
        assert {r.key: r.value for r in store.items()} == state
    disk = CountingDisk()
    with RecordStore.open(path, disk=disk, options=SMALL) as store:
        assert disk.record_opens == 0 and {r.key: r.value for r in store.items()} == state
    # A v4 MANIFEST that names a catalog is not one any build wrote.
    manifest = json.loads(mpath.read_bytes())
    manifest["format"] = "per-record-v4"
    mpath.write_text(json.dumps(manifest))
    with pytest.raises(StoreCorruptError, match="names no catalog"):
        RecordStore.open(path, options=SMALL)


class FailingRenameDisk(OsDisk):
    """Fails the next rename whose target ends with ``target`` (once), with EIO."""

    def __init__(self, target: str) -> None:
        self.target = target

    def rename(self, src: str, dst: str) -> None:
        if self.target and dst.endswith(self.target):
            self.target = ""
            raise OSError(5, "injected EIO")
        super().rename(src, dst)


@pytest.mark.anyio
@pytest.mark.parametrize("target", [CATALOG, record_file_name("b")])
async def test_a_failed_automatic_checkpoint_does_not_fail_the_durable_commit(
    tmp_path: Path, target: str
) -> None:
    """The commit that found the log full is durable before its checkpoint starts; a
    checkpoint that then fails (here a record file's rename) is logged and retried by the
    next commit, never reported to that committer as a failed commit. (A failed catalog
    write does not even fail the checkpoint: the MANIFEST then names no catalog.)"""
    path = str(tmp_path / "s")
    os.chmod(tmp_path, 0o700)
    disk = FailingRenameDisk("")
    # A log cap of one segment: every commit finds the log full and checkpoints.
    options = StoreOptions(
        wal=WalOptions(segment_size=MiB, max_payload=MiB // 4, zero_fill=False, max_log_bytes=MiB)
    )
    with RecordStore.open(path, disk=disk, options=options) as store:
        await store.transact([Put("a", b"1")])
        disk.target = target
        lsn = await store.transact([Put("b", b"2")])
        assert disk.target == "" and store.get("b").lsn == lsn  # type: ignore[union-attr]
    with RecordStore.open(path, options=SMALL) as store:
        assert {r.key: r.value for r in store.items()} == {"a": b"1", "b": b"2"}

"""Fail-closed rules of the state directory, one test per rule.

Each test tampers with a closed, healthy store, then checks that ``RecordStore.open`` refuses
with an ``UnsafeStateError`` naming the offending path and the rule, and that the refusal
changed nothing on disk.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import pytest
from _disk_helpers import (
    SMALL,
    RecordingDisk,
    populate,
    record_path,
    replace_with_copy,
    snapshot,
    write_owner_only,
)

from afterword.disk import DiskFailedError, StateRoot, UnsafeStateError
from afterword.store import Put, RecordStore, RecordTooLarge, StoreOptions
from afterword.store.codec import MAX_MANIFEST_BYTES, RecordImage, encode_record
from afterword.store.store import MAX_RECORD_BYTES

FOREIGN_UID = 12345


def refuse_open(state: str, path: str, rule: str, **kwargs: object) -> UnsafeStateError:
    """Opening and reading every record must fail with ``rule`` at ``path`` and leave the
    tree exactly as it was. A record file listed by the checkpoint catalog is checked when
    its record is first read (the open reads the catalog instead of every file), so the
    refusal may come from that read; nothing unsafe is ever returned."""
    before = snapshot(os.path.dirname(state))
    with pytest.raises(UnsafeStateError) as info:
        store = RecordStore.open(state, **kwargs)  # type: ignore[arg-type]
        try:
            list(store.items())
        finally:
            store.close()
    err = info.value
    assert (err.path, err.rule) == (path, rule), str(err)
    assert path in str(err) and rule in str(err)
    assert snapshot(os.path.dirname(state)) == before
    return err


def reopen_ok(state: str, model: dict[str, bytes]) -> None:
    with RecordStore.open(state, options=SMALL) as store:
        assert {r.key: r.value for r in store.items()} == model


# -- links -------------------------------------------------------------------------------------


def test_symlinked_record_file(state_dir: str, tmp_path: Path) -> None:
    model = populate(state_dir)
    rec = record_path(state_dir, "rec:1")
    target = str(tmp_path / "valid-copy.rec")
    shutil.copyfile(rec, target)  # a perfectly valid record, just reached through a link
    os.chmod(target, 0o600)
    os.unlink(rec)
    os.symlink(target, rec)
    refuse_open(state_dir, rec, "symlink", options=SMALL)
    os.unlink(rec)
    os.rename(target, rec)
    reopen_ok(state_dir, model)


@pytest.mark.parametrize("sub", ["records", "wal"])
def test_symlinked_intermediate_directory(state_dir: str, tmp_path: Path, sub: str) -> None:
    model = populate(state_dir)
    real = os.path.join(state_dir, sub)
    elsewhere = str(tmp_path / f"{sub}-elsewhere")
    os.rename(real, elsewhere)  # the same valid 0700 directory, now behind a link
    os.symlink(elsewhere, real)
    # refuse_open's snapshot covers tmp_path, so nothing was created through the link either.
    refuse_open(state_dir, real, "symlink", options=SMALL)
    os.unlink(real)
    os.rename(elsewhere, real)
    reopen_ok(state_dir, model)


def test_symlinked_state_root(state_dir: str, tmp_path: Path) -> None:
    populate(state_dir)
    real = str(tmp_path / "real-state")
    os.rename(state_dir, real)
    os.symlink(real, state_dir)
    refuse_open(state_dir, state_dir, "symlink", options=SMALL)


def test_hard_linked_record_file(state_dir: str, tmp_path: Path) -> None:
    model = populate(state_dir)
    rec = record_path(state_dir, "rec:0")
    other = str(tmp_path / "second-name")
    os.link(rec, other)  # outside the state dir: whoever holds it can rewrite our record
    refuse_open(state_dir, rec, "hard_link", options=SMALL)
    os.unlink(other)
    reopen_ok(state_dir, model)


# -- modes and owners --------------------------------------------------------------------------


def test_group_readable_record_file(state_dir: str) -> None:
    model = populate(state_dir)
    rec = record_path(state_dir, "rec:2")
    os.chmod(rec, 0o644)
    refuse_open(state_dir, rec, "permissive_mode", options=SMALL)
    os.chmod(rec, 0o600)
    reopen_ok(state_dir, model)


@pytest.mark.parametrize("sub", ["", "records", "wal"])
def test_world_readable_directory(state_dir: str, sub: str) -> None:
    model = populate(state_dir)
    directory = os.path.join(state_dir, sub) if sub else state_dir
    os.chmod(directory, 0o755)
    refuse_open(state_dir, directory, "permissive_mode", options=SMALL)
    os.chmod(directory, 0o700)
    reopen_ok(state_dir, model)


@pytest.mark.parametrize("what", ["record", "directory"])
def test_a_file_owned_by_another_uid_refuses_open_until_given_back(state_dir: str, what: str) -> None:
    model = populate(state_dir)
    victim = record_path(state_dir, "rec:0") if what == "record" else os.path.join(state_dir, "records")
    try:
        os.chown(victim, FOREIGN_UID, -1)
    except PermissionError:
        pytest.skip("not root: cannot give a file to another uid, so wrong_owner is untestable here")
    refuse_open(state_dir, victim, "wrong_owner", options=SMALL)
    os.chown(victim, os.geteuid(), -1)
    reopen_ok(state_dir, model)


# -- file types --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_record_path_is_not_a_regular_file(state_dir: str, kind: str) -> None:
    populate(state_dir)
    rec = record_path(state_dir, "rec:1")
    os.unlink(rec)
    if kind == "fifo":
        os.mkfifo(rec, 0o600)  # opening must not block: the seam opens with O_NONBLOCK
    else:
        os.mkdir(rec, 0o700)
    refuse_open(state_dir, rec, "not_regular", options=SMALL)


def test_wal_segment_is_a_fifo(state_dir: str) -> None:
    populate(state_dir)
    seg = sorted(glob.glob(os.path.join(state_dir, "wal", "*.seg")))[0]
    os.unlink(seg)
    os.mkfifo(seg, 0o600)
    refuse_open(state_dir, seg, "not_regular", options=SMALL)


# -- sizes -------------------------------------------------------------------------------------


def test_oversized_manifest_refused_before_reading(state_dir: str) -> None:
    populate(state_dir)
    manifest = os.path.join(state_dir, "MANIFEST")
    with open(manifest, "rb") as fh:
        valid = fh.read()
    # Still a valid manifest once parsed (JSON allows trailing blanks): only the size rule
    # can refuse it.
    write_owner_only(manifest, valid + b" " * (MAX_MANIFEST_BYTES + 1 - len(valid)))
    disk = RecordingDisk()
    refuse_open(state_dir, manifest, "too_large", disk=disk, options=SMALL)
    assert all(size <= MAX_MANIFEST_BYTES for size in disk.pread_sizes), "read before the size check"


def test_manifest_at_the_limit_is_accepted(state_dir: str) -> None:
    model = populate(state_dir)
    manifest = os.path.join(state_dir, "MANIFEST")
    with open(manifest, "rb") as fh:
        valid = fh.read()
    write_owner_only(manifest, valid + b" " * (MAX_MANIFEST_BYTES - len(valid)))
    reopen_ok(state_dir, model)


def test_oversized_record_file_refused_before_reading(state_dir: str) -> None:
    populate(state_dir, options=StoreOptions())
    key = "rec:0"
    rec = record_path(state_dir, key)
    # A well-formed record file, larger than any record the store can write (2 MiB of value
    # plus the header allowance): only the size rule can refuse it.
    image = RecordImage(key, 1, b"x" * (MAX_RECORD_BYTES + 4096))
    data = encode_record(image)
    write_owner_only(rec, data)
    disk = RecordingDisk()
    refuse_open(state_dir, rec, "too_large", disk=disk)
    assert len(data) not in disk.pread_sizes, "read before the size check"


@pytest.mark.anyio
async def test_oversized_put_writes_nothing(state_dir: str) -> None:
    populate(state_dir)
    with RecordStore.open(state_dir, options=SMALL) as store:
        before = snapshot(state_dir)
        lsn = store.wal.next_lsn
        too_big = b"y" * (MAX_RECORD_BYTES + 1)
        with pytest.raises(RecordTooLarge):
            store.transact_sync([Put("small", b"ok"), Put("big", too_big)])
        with pytest.raises(RecordTooLarge):
            await store.transact([Put("big", too_big)])
        assert store.get("small") is None and store.get("big") is None
        assert store.wal.next_lsn == lsn
        assert snapshot(state_dir) == before
        # The limit itself is allowed: the rule is "larger than", not "large".
        store.transact_sync([Put("big", b"y" * MAX_RECORD_BYTES)])
    with RecordStore.open(state_dir, options=SMALL) as store:
        rec = store.get("big")
        assert rec is not None and len(rec.value) == MAX_RECORD_BYTES
        assert store.get("small") is None


# -- identity ----------------------------------------------------------------------------------


def test_replaced_file_detected_by_identity_check(state_dir: str) -> None:
    root = StateRoot(state_dir)
    root.write_atomic("data", b"original")
    handle = root.open_file("data", writable=True)
    try:
        root.check_identity(handle)  # same inode: fine
        replace_with_copy(root.path("data"))
        with pytest.raises(UnsafeStateError) as info:
            root.check_identity(handle)
        assert (info.value.path, info.value.rule) == (root.path("data"), "identity_changed")
    finally:
        root.close(handle)


def test_record_file_replaced_by_atomic_write_invalidates_old_handle(state_dir: str) -> None:
    populate(state_dir)
    with RecordStore.open(state_dir, options=SMALL) as store:
        rel = "records/" + b"rec:0".hex() + ".rec"
        handle = store.root.open_file(rel)
        try:
            store.transact_sync([Put("rec:0", b"new")])
            store.checkpoint_sync()  # rewrites the record file: a new inode at the same path
            with pytest.raises(UnsafeStateError) as info:
                store.root.check_identity(handle)
            assert info.value.rule == "identity_changed"
            assert info.value.path == record_path(state_dir, "rec:0")
        finally:
            store.root.close(handle)


def test_manifest_swapped_while_being_read(state_dir: str) -> None:
    populate(state_dir)
    manifest = os.path.join(state_dir, "MANIFEST")
    disk = RecordingDisk()
    root = StateRoot(state_dir, disk)
    disk.before_pread = lambda: replace_with_copy(manifest)
    with pytest.raises(UnsafeStateError) as info:
        root.read_file("MANIFEST", max_size=MAX_MANIFEST_BYTES)
    assert (info.value.path, info.value.rule) == (manifest, "identity_changed")


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.anyio
async def test_wal_segment_replaced_while_open(state_dir: str, tmp_path: Path, mode: str) -> None:
    model = populate(state_dir)
    store = RecordStore.open(state_dir, options=SMALL)
    try:
        segments = glob.glob(os.path.join(state_dir, "wal", "*.seg"))
        assert len(segments) == 1
        seg = segments[0]
        aside = str(tmp_path / "original-segment")
        replace_with_copy(seg, aside=aside)
        with open(seg, "rb") as fh:
            replacement = fh.read()
        with pytest.raises(UnsafeStateError) as info:
            if mode == "sync":
                store.transact_sync([Put("lost", b"never acknowledged")])
            else:
                await store.transact([Put("lost", b"never acknowledged")])
        assert (info.value.path, info.value.rule) == (seg, "identity_changed")
        assert store.get("lost") is None
        with open(seg, "rb") as fh:
            assert fh.read() == replacement, "bytes reached the file that replaced our segment"
        with open(aside, "rb") as fh:
            assert b"never acknowledged" not in fh.read(), "bytes went through the stale descriptor"
        # Putting the original inode back must not revive the log: once tampering was seen,
        # every later commit is refused until the store is reopened and recovered.
        os.unlink(seg)
        os.rename(aside, seg)
        with pytest.raises((DiskFailedError, UnsafeStateError)):
            store.transact_sync([Put("after", b"refused")])
        with pytest.raises((DiskFailedError, UnsafeStateError)):
            await store.transact([Put("after", b"refused")])
        with pytest.raises((DiskFailedError, UnsafeStateError)):
            await store.checkpoint()
        assert store.get("after") is None
    finally:
        store.close()
    reopen_ok(state_dir, model)

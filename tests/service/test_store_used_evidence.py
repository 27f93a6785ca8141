"""An emptied used directory is refused, not opened as a new store (issue 29, point 3).

Deleting ``MANIFEST`` and the log of a store that never checkpointed (or also its record files
and catalog) used to open as a new, healthy, empty store, and doctor called it "never opened
by a host". The secret, the rollback guard, the catalog, record files, log slots, blobs and
payloads each prove the directory was used; the open refuses (``manifest_missing``) and names
the file it found.
"""

from __future__ import annotations

import glob
import os

import pytest
from _disk_helpers import SMALL, abandon

from afterword.cli.doctor import diagnose
from afterword.store import Put, RecordStore, open_readonly
from afterword.store.evidence import EvidenceError

DIGEST = "ab" * 32


def _used(path: str, *, checkpoint: bool) -> None:
    store = RecordStore.open(path, options=SMALL)
    for i in range(3):
        store.transact_sync([Put(f"k:{i}", b"acknowledged")])
    if checkpoint:
        store.checkpoint_sync()
        store.transact_sync([Put("k:after", b"acknowledged")])
    abandon(store)


def _remove(path: str, *patterns: str) -> None:
    for pattern in patterns:
        for name in glob.glob(os.path.join(path, pattern)):
            os.unlink(name)


def _refused_naming(path: str, evidence: str) -> None:
    with pytest.raises(EvidenceError) as err:
        RecordStore.open(path, options=SMALL)
    assert err.value.rule == "manifest_missing"
    assert os.path.join(path, evidence) in str(err.value)
    with pytest.raises(EvidenceError) as err2:
        open_readonly(path, options=SMALL, attempts=1)
    assert err2.value.rule == "manifest_missing"
    d = diagnose(path)
    assert not d.healthy and d.rule == "manifest_missing"
    assert not any("never opened" in note for note in d.notes)


def test_manifest_and_log_of_a_never_checkpointed_store_deleted(state_dir: str) -> None:
    _used(state_dir, checkpoint=False)
    _remove(state_dir, "MANIFEST", "wal/*.seg")
    assert not os.listdir(os.path.join(state_dir, "records"))  # nothing else proves use but the secret
    _refused_naming(state_dir, "secret")


def test_manifest_log_records_and_catalog_of_a_checkpointed_store_deleted(state_dir: str) -> None:
    _used(state_dir, checkpoint=True)
    _remove(state_dir, "MANIFEST", "CATALOG", "wal/*.seg", "records/*.rec")
    _refused_naming(state_dir, "secret")


@pytest.mark.parametrize(
    "evidence",
    [
        "secret",
        "HIGHWATER",
        "CATALOG",
        "records-v2/ROLLBACK-GUARD",
        f"payloads/{DIGEST}",
        f"blobs/{DIGEST}",
        "wal/00000001.seg",
        "wal/00000001.broken.1",
        "records/6b3a30.rec",
    ],
)
def test_each_file_a_used_store_writes_is_evidence(state_dir: str, evidence: str) -> None:
    os.mkdir(state_dir, 0o700)
    head = os.path.dirname(evidence)
    if head:
        os.mkdir(os.path.join(state_dir, head), 0o700)
    fd = os.open(os.path.join(state_dir, evidence), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"\0" * 32)
    os.close(fd)
    _refused_naming(state_dir, evidence)


def test_legacy_files_alone_are_not_evidence_of_a_v3_store(state_dir: str) -> None:
    """A 0.10 directory (records-v2/*.json, no guard) is opened to be migrated."""
    os.mkdir(state_dir, 0o700)
    os.mkdir(os.path.join(state_dir, "records-v2"), 0o700)
    with RecordStore.open(state_dir, options=SMALL) as store:
        assert len(store) == 0


def test_a_secret_alone_is_refused_but_a_first_open_mark_lets_it_finish(state_dir: str) -> None:
    """A first open marks its work (``CREATING``) before it writes the secret and clears the
    mark once its MANIFEST is durable: with the mark, a secret without a MANIFEST is that open
    interrupted, and the next open finishes it with the same secret."""
    with RecordStore.open(state_dir, options=SMALL):
        pass
    assert not os.path.exists(os.path.join(state_dir, "CREATING"))
    with open(os.path.join(state_dir, "secret"), "rb") as fh:
        secret = fh.read()
    # An interrupted first open stops before its MANIFEST, so it never wrote a HIGHWATER mark.
    _remove(state_dir, "MANIFEST", "owner.db", "wal/*.seg", "HIGHWATER")
    _refused_naming(state_dir, "secret")
    fd = os.open(os.path.join(state_dir, "CREATING"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    assert diagnose(state_dir).healthy
    with RecordStore.open(state_dir, options=SMALL) as store:
        assert store.secret == secret
        store.transact_sync([Put("k:new", b"v")])
    assert not os.path.exists(os.path.join(state_dir, "CREATING"))


def test_a_first_open_mark_beside_a_manifest_is_cleared(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=SMALL) as store:
        store.transact_sync([Put("k:1", b"v")])
    fd = os.open(os.path.join(state_dir, "CREATING"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    with RecordStore.open(state_dir, options=SMALL) as store:
        assert store.get("k:1") is not None
    assert not os.path.exists(os.path.join(state_dir, "CREATING"))


def test_the_mark_does_not_excuse_other_evidence(state_dir: str) -> None:
    _used(state_dir, checkpoint=True)
    _remove(state_dir, "MANIFEST", "wal/*.seg", "CATALOG")
    fd = os.open(os.path.join(state_dir, "CREATING"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    _refused_naming(state_dir, "records/")

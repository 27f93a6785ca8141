"""The content-addressed blob store: round trip, verification, quota, sweep, HMAC binding."""

from __future__ import annotations

import os

import pytest
from _disk_helpers import SMALL, snapshot

from afterword.blobs import (
    BlobBindingError,
    BlobCorruptError,
    BlobMissingError,
    BlobQuotaExceeded,
    BlobStore,
    blob_digest,
)
from afterword.disk import StateRoot
from afterword.store import Put, RecordStore

SECRET = bytes(range(32))
OTHER_SECRET = bytes(range(1, 33))


def blob_store(state_dir: str, *, secret: bytes = SECRET, quota: int = 1024 * 1024) -> BlobStore:
    return BlobStore(StateRoot(state_dir), secret, quota=quota)


def blob_files(state_dir: str) -> list[str]:
    return sorted(os.listdir(os.path.join(state_dir, "blobs")))


# -- round trip and verification ---------------------------------------------------------------


def test_round_trip_is_content_addressed(state_dir: str) -> None:
    blobs = blob_store(state_dir)
    data = b"origin snapshot \x00\xff" * 100
    digest = blobs.put(data)
    assert digest == blob_digest(data) and len(digest) == 64
    assert blobs.get(digest) == data
    assert blobs.put(data) == digest  # same content, same name, stored once
    assert blob_files(state_dir) == [digest]
    assert blobs.used_bytes == len(data)
    path = os.path.join(state_dir, "blobs", digest)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert blob_store(state_dir).get(digest) == data  # survives a reopen


def test_corruption_detected_on_read(state_dir: str) -> None:
    blobs = blob_store(state_dir)
    digest = blobs.put(b"a" * 4096)
    path = os.path.join(state_dir, "blobs", digest)
    with open(path, "r+b") as fh:
        fh.seek(1234)
        fh.write(b"b")  # one flipped byte, same size
    with pytest.raises(BlobCorruptError):
        blobs.get(digest)
    with pytest.raises(BlobCorruptError):
        blob_store(state_dir).get(digest)


def test_a_blob_never_stored_raises_blob_missing(state_dir: str) -> None:
    blobs = blob_store(state_dir)
    with pytest.raises(BlobMissingError):
        blobs.get(blob_digest(b"never stored"))


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "0" * 63,
        "0" * 65,
        "A" * 64,  # upper case is not the canonical spelling
        "g" * 64,
        "../secret",
        "0" * 62 + "/x",
    ],
)
def test_malformed_digest_rejected(state_dir: str, bad: str) -> None:
    blobs = blob_store(state_dir)
    with pytest.raises(ValueError):
        blobs.get(bad)
    with pytest.raises(ValueError):
        blobs.bind(bad, b"meta")
    with pytest.raises(ValueError):
        blobs.verify_binding(bad, b"meta", "0" * 64)


# -- quota -------------------------------------------------------------------------------------


def test_quota_exceeded_leaves_nothing_behind(state_dir: str) -> None:
    blobs = blob_store(state_dir, quota=100)
    first = blobs.put(b"1" * 60)
    before = snapshot(state_dir)
    with pytest.raises(BlobQuotaExceeded):
        blobs.put(b"2" * 41)
    assert snapshot(state_dir) == before  # no blob, no temporary
    assert blob_files(state_dir) == [first]
    assert blobs.used_bytes == 60
    assert blob_digest(b"2" * 41) not in blobs
    blobs.put(b"1" * 60)  # already stored: costs nothing
    blobs.put(b"3" * 40)  # exactly up to the quota is allowed
    assert blobs.used_bytes == 100


def test_quota_accounting_rebuilt_at_open(state_dir: str) -> None:
    blobs = blob_store(state_dir, quota=100)
    a = blobs.put(b"a" * 30)
    b = blobs.put(b"b" * 50)
    reopened = blob_store(state_dir, quota=100)
    assert reopened.used_bytes == 80
    assert reopened.digests() == {a, b}
    with pytest.raises(BlobQuotaExceeded):
        reopened.put(b"c" * 21)  # would fit only if the reopened store forgot what it holds
    reopened.put(b"c" * 20)
    assert blob_store(state_dir, quota=100).used_bytes == 100


def test_quota_counts_files_on_disk_not_promises(state_dir: str) -> None:
    # A file truncated behind our back is accounted at its real size after reopen, and then
    # served as corrupt rather than as short data.
    blobs = blob_store(state_dir, quota=100)
    digest = blobs.put(b"z" * 90)
    os.truncate(os.path.join(state_dir, "blobs", digest), 10)
    reopened = blob_store(state_dir, quota=100)
    assert reopened.used_bytes == 10
    with pytest.raises(BlobCorruptError):
        reopened.get(digest)


# -- sweep -------------------------------------------------------------------------------------


def test_sweep_keeps_referenced_and_pinned(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=SMALL) as store:
        blobs = BlobStore(store.root, store.secret, quota=1024 * 1024)
        referenced = blobs.put(b"referenced by a record")
        pinned = blobs.put(b"written, record not yet committed")
        orphan = blobs.put(b"the record never committed")
        replaced = blobs.put(b"referenced only by an old version")
        store.transact_sync([Put("claim:1", b"v1", blobs=(replaced,))])
        store.transact_sync([Put("claim:1", b"v2", blobs=(referenced,))])
        for digest in (referenced, orphan, replaced):
            blobs.unpin(digest)

        removed = blobs.sweep(store.referenced_blobs())
        assert sorted(removed) == sorted([orphan, replaced])
        assert blob_files(state_dir) == sorted([referenced, pinned])
        assert blobs.get(referenced) == b"referenced by a record"
        assert blobs.used_bytes == len(b"referenced by a record") + len(b"written, record not yet committed")

        before = snapshot(state_dir)
        assert blobs.sweep(store.referenced_blobs()) == []  # idempotent
        assert snapshot(state_dir) == before

        blobs.unpin(pinned)  # its record gave up: now it is garbage too
        assert blobs.sweep(store.referenced_blobs()) == [pinned]
        store.checkpoint_sync()

    # References are durable: after a reopen (record files + WAL) the referenced blob stays.
    with RecordStore.open(state_dir, options=SMALL) as store:
        blobs = BlobStore(store.root, store.secret, quota=1024 * 1024)
        assert store.referenced_blobs() == {referenced}
        assert blobs.sweep(store.referenced_blobs()) == []
        assert blob_files(state_dir) == [referenced]


def test_pins_are_counted(state_dir: str) -> None:
    blobs = blob_store(state_dir)
    digest = blobs.put(b"shared")
    blobs.put(b"shared")  # two writers, two pins
    blobs.unpin(digest)
    assert blobs.sweep(set()) == []
    blobs.unpin(digest)
    assert blobs.sweep(set()) == [digest]


def test_sweep_after_crash_midway(state_dir: str) -> None:
    # A sweep interrupted after unlinking some files is simply run again from the next open.
    blobs = blob_store(state_dir)
    doomed = [blobs.put(b"garbage %d" % i) for i in range(4)]
    keep = blobs.put(b"keep")
    for digest in doomed:
        blobs.unpin(digest)
    os.unlink(os.path.join(state_dir, "blobs", doomed[0]))  # the part that ran before the crash
    reopened = blob_store(state_dir)
    assert sorted(reopened.sweep({keep})) == sorted(doomed[1:])
    assert blob_files(state_dir) == [keep]


# -- HMAC binding ------------------------------------------------------------------------------


def test_binding_round_trip(state_dir: str) -> None:
    blobs = blob_store(state_dir)
    digest = blobs.put(b"snapshot")
    mac = blobs.bind(digest, b'{"claim":"c1","tool":"t"}')
    # A lowercase hex SHA-256 HMAC; the same inputs give the same MAC ...
    assert len(mac) == 64 and set(mac) <= set("0123456789abcdef")
    assert blobs.bind(digest, b'{"claim":"c1","tool":"t"}') == mac
    # ... and every bound input changes it: the digest, any metadata byte, the store's secret.
    other = blobs.put(b"another snapshot")
    assert blobs.bind(other, b'{"claim":"c1","tool":"t"}') != mac
    assert blobs.bind(digest, b'{"claim":"c2","tool":"t"}') != mac
    assert blobs.bind(digest, b'{"claim":"c1","tool":"t"} ') != mac
    assert (
        blob_store(state_dir + "-other", secret=b"x" * 32).bind(digest, b'{"claim":"c1","tool":"t"}') != mac
    )
    blobs.verify_binding(digest, b'{"claim":"c1","tool":"t"}', mac)
    # Deterministic under the same secret: a reopened store verifies old bindings.
    blob_store(state_dir).verify_binding(digest, b'{"claim":"c1","tool":"t"}', mac)


def test_binding_rejects_altered_metadata(state_dir: str) -> None:
    blobs = blob_store(state_dir)
    digest = blobs.put(b"snapshot")
    meta = b'{"claim":"c1","tool":"t"}'
    mac = blobs.bind(digest, meta)
    for altered in (b'{"claim":"c2","tool":"t"}', meta + b" ", meta[:-1], b""):
        with pytest.raises(BlobBindingError):
            blobs.verify_binding(digest, altered, mac)


def test_binding_rejects_altered_digest(state_dir: str) -> None:
    blobs = blob_store(state_dir)
    digest = blobs.put(b"snapshot")
    other = blobs.put(b"another snapshot")
    mac = blobs.bind(digest, b"meta")
    with pytest.raises(BlobBindingError):
        blobs.verify_binding(other, b"meta", mac)
    flipped = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    with pytest.raises(BlobBindingError):
        blobs.verify_binding(flipped, b"meta", mac)


def test_binding_rejects_altered_mac(state_dir: str) -> None:
    blobs = blob_store(state_dir)
    digest = blobs.put(b"snapshot")
    mac = blobs.bind(digest, b"meta")
    flipped = mac[:-1] + ("0" if mac[-1] != "0" else "1")
    for bad in (flipped, mac[:-2], "", mac.upper(), "é" * 64):
        with pytest.raises(BlobBindingError):
            blobs.verify_binding(digest, b"meta", bad)


def test_binding_from_another_secret_rejected(state_dir: str) -> None:
    ours = blob_store(state_dir)
    digest = ours.put(b"snapshot")
    theirs = BlobStore(StateRoot(state_dir), OTHER_SECRET, rel_dir="their-blobs")
    forged = theirs.bind(digest, b"meta")
    assert forged != ours.bind(digest, b"meta")
    with pytest.raises(BlobBindingError):
        ours.verify_binding(digest, b"meta", forged)


def test_binding_uses_the_store_secret(state_dir: str) -> None:
    # The binding key comes from the record store's persistent secret: it verifies after the
    # store is reopened, and a different state directory cannot produce it.
    with RecordStore.open(state_dir, options=SMALL) as store:
        blobs = BlobStore(store.root, store.secret)
        digest = blobs.put(b"snapshot")
        mac = blobs.bind(digest, b"meta")
        secret = store.secret
    with RecordStore.open(state_dir, options=SMALL) as store:
        assert store.secret == secret
        BlobStore(store.root, store.secret).verify_binding(digest, b"meta", mac)
    other_state = state_dir + "-other"
    with RecordStore.open(other_state, options=SMALL) as other:
        assert other.secret != secret
        with pytest.raises(BlobBindingError):
            BlobStore(other.root, other.secret).verify_binding(digest, b"meta", mac)

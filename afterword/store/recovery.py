"""Opening a state directory: create or validate it, load the records, replay the log.

Every check here fails closed (``docs/storage-format.md`` section 5): a MANIFEST without its
secret, record files or log segments without a MANIFEST, a digest of the loaded and replayed
records that disagrees with the MANIFEST's evidence, a log that stops short of what the
MANIFEST says was acknowledged.
"""

from __future__ import annotations

import secrets as _secrets
from dataclasses import dataclass

from ..disk import StateRoot, UnsafeStateError
from ..wal import NamedSegment, WriteAheadLog
from ..wal.highwater import HighWater
from .catalog import names_check, read_catalog, read_catalogued
from .codec import Manifest, encode_manifest, record_file_name, seal_manifest
from .evidence import Digest, EvidenceError, ReplayCheck, check_secret, secret_check
from .loading import (
    MANIFEST,
    RECORDS,
    SECRET,
    SECRET_BYTES,
    WAL_DIR,
    check_guard_file,
    load_record_files,
    read_manifest,
    read_secret,
    record_names,
)
from .manifest import ManifestKeeper, generation_id
from .memory import CommittedState
from .types import StoreOptions
from .usage import CREATING, refuse_if_used


@dataclass
class Recovered:
    manifests: ManifestKeeper  # the MANIFEST found (or created), with the log attached
    wal: WriteAheadLog
    replayed: int  # transactions replayed from the log
    last_check: int  # checksum field of the last replayed frame (0: none replayed)


def recover(root: StateRoot, options: StoreOptions, state: CommittedState) -> Recovered:
    """Bring ``state`` to the last durable commit of the directory at ``root``."""
    root.remove_temporaries("")
    check_guard_file(root)
    manifest = read_manifest(root)
    secret = read_secret(root)
    if manifest is None:
        secret, manifest = _create(root, secret)
    else:
        # The secret was durable before the first MANIFEST: state without it is damage.
        check_secret(root.path(SECRET), secret, manifest.secret_check)
        assert secret is not None
        if root.exists(CREATING):  # the first open stopped after its MANIFEST was durable
            root.remove(CREATING)
    if not root.exists(RECORDS):
        raise UnsafeStateError(root.path(RECORDS), "missing")
    manifests = ManifestKeeper(root, secret, manifest)
    expected_files = _load_records(root, options, state, manifest)
    check = ReplayCheck(
        records_path=root.path(RECORDS),
        checkpoint_lsn=manifest.checkpoint_lsn,
        digest=manifest.record_digest,
        count=manifest.record_count,
        # Read files only: catalogued versions are at most the checkpoint's (read_catalog).
        loaded={key: rec.lsn for key, rec in state.records.items()},
    )
    # Opened last before the log, which owns (and on a refusal closes) the descriptor.
    high_water = HighWater.open(root, bytes.fromhex(manifest.high_water)) if manifest.high_water else None
    wal, frames = WriteAheadLog.open(
        root,
        rel_dir=WAL_DIR,
        start_seq=manifest.wal_start_seq,
        checkpoint_lsn=manifest.checkpoint_lsn,
        options=options.wal,
        named=[NamedSegment(r.slot, r.seq, int(r.salt, 16), r.first_lsn, r.size) for r in manifest.segments],
        acked_lsn=manifest.acked_lsn,
        before_free=manifests.forget_segments,  # names the segments it is about to reuse
        high_water=high_water,
    )
    manifests.wal = wal
    # The log continues the checkpoint, and reaches every lsn the MANIFEST saw acknowledged
    # (WriteAheadLog.open refuses otherwise).
    assert frames.first_lsn == manifest.checkpoint_lsn + 1
    assert frames.first_lsn + len(frames) - 1 >= manifest.acked_lsn
    try:
        state.replay(frames, check)
        check.finish(state.digest)
        _check_catalogued_files(root, state, expected_files)
    except BaseException:
        wal.close()
        raise
    last_check = frames.checksum(len(frames) - 1) if len(frames) else 0
    return Recovered(manifests, wal, len(frames), last_check)


def _create(root: StateRoot, secret: bytes | None) -> tuple[bytes, Manifest]:
    """Create a new store, or finish creating one whose first open was interrupted."""
    refuse_if_used(root)
    # The mark goes first: a secret without a MANIFEST and without it proves a used directory.
    if not root.exists(CREATING):
        root.write_atomic(CREATING, b"")
    if secret is None:
        root.write_atomic(SECRET, _secrets.token_bytes(SECRET_BYTES))
        secret = read_secret(root)
    assert secret is not None
    manifest = seal_manifest(
        Manifest(
            generation=generation_id(0),
            checkpoint_lsn=0,
            wal_start_seq=1,
            record_count=0,
            record_digest=Digest().text(),
            secret_check=secret_check(secret),
        )
    )
    root.ensure_dir(RECORDS)
    root.write_atomic(MANIFEST, encode_manifest(manifest))
    root.remove(CREATING)
    return secret, manifest


def _load_records(
    root: StateRoot, options: StoreOptions, state: CommittedState, manifest: Manifest
) -> list[str]:
    """Load ``state`` from the catalog when the MANIFEST names a good one, else from every
    record file. Returns the keys the catalog lists whose file is missing (checked after
    replay: only a record replay replaces or deletes may have lost its file)."""
    # One listing serves the temporary cleanup, the load, and the catalog's check (the
    # directory can hold tens of thousands of names; listing it is a visible part of the open).
    names, temporaries = record_names(root)
    for name in temporaries:
        root.remove(f"{RECORDS}/{name}", sync_dir=False)
    if temporaries:
        root.sync_dir(RECORDS)
    catalog = read_catalog(root, manifest)
    if catalog is None:
        state.load(load_record_files(root, options.max_record_bytes, names))
        return []
    entries = catalog.entries
    missing: list[str] = []
    extra: list[str] = []
    if names_check(names) != catalog.files:  # (sorted listing) not exactly the files expected
        expected = [record_file_name(e.key) for e in entries]
        present = set(names)
        catalogued = set(expected)
        missing = [e.key for e, name in zip(entries, expected, strict=True) if name not in present]
        extra = [name for name in names if name not in catalogued]
    # Files the catalog does not list: early writes of a checkpoint that was cut short (or
    # damage). Read now, they pass the same evidence checks as when every file is read.
    found = load_record_files(root, options.max_record_bytes, extra) if extra else {}
    max_bytes = options.max_record_bytes
    state.load_catalog(entries, found, lambda wanted: read_catalogued(root, max_bytes, wanted), catalog.tags)
    return missing


def _check_catalogued_files(root: StateRoot, state: CommittedState, missing: list[str]) -> None:
    for key in missing:
        if key in state.unread:
            raise EvidenceError(
                root.path(f"{RECORDS}/{record_file_name(key)}"),
                "record_digest",
                f"the checkpoint recorded {key!r} at version {state.unread[key].lsn}; its file is gone",
            )

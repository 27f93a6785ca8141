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
from ..wal.frame import SEGMENT_MAGIC
from ..wal.reader import read_segment_images
from .codec import Manifest, decode_tx, encode_manifest
from .errors import StoreCorruptError
from .evidence import Digest, EvidenceError, ReplayCheck, check_secret, secret_check
from .loading import (
    MANIFEST,
    RECORDS,
    SECRET,
    SECRET_BYTES,
    WAL_DIR,
    load_record_files,
    read_manifest,
    read_secret,
    record_names,
)
from .manifest import ManifestKeeper, generation_id
from .memory import CommittedState
from .types import StoreOptions


@dataclass
class Recovered:
    manifests: ManifestKeeper  # the MANIFEST found (or created), with the log attached
    wal: WriteAheadLog
    replayed: int  # transactions replayed from the log


def recover(root: StateRoot, options: StoreOptions, state: CommittedState) -> Recovered:
    """Bring ``state`` to the last durable commit of the directory at ``root``."""
    root.remove_temporaries("")
    manifest = read_manifest(root)
    secret = read_secret(root)
    if manifest is None:
        secret, manifest = _create(root, secret)
    else:
        # The secret was durable before the first MANIFEST: state without it is damage.
        check_secret(root.path(SECRET), secret, manifest.secret_check)
        assert secret is not None
    if not root.exists(RECORDS):
        raise UnsafeStateError(root.path(RECORDS), "missing")
    manifests = ManifestKeeper(root, secret, manifest)
    _load_records(root, options, state)
    check = ReplayCheck(
        records_path=root.path(RECORDS),
        checkpoint_lsn=manifest.checkpoint_lsn,
        digest=manifest.record_digest,
        count=manifest.record_count,
        loaded={key: rec.lsn for key, rec in state.records.items()},
    )
    wal, frames = WriteAheadLog.open(
        root,
        rel_dir=WAL_DIR,
        start_seq=manifest.wal_start_seq,
        checkpoint_lsn=manifest.checkpoint_lsn,
        options=options.wal,
        named=[NamedSegment(r.slot, r.seq, int(r.salt, 16), r.first_lsn, r.size) for r in manifest.segments],
        acked_lsn=manifest.acked_lsn,
        before_free=manifests.forget_segments,  # names the segments it is about to reuse
    )
    manifests.wal = wal
    try:
        for frame in frames:
            ops = decode_tx(frame.payload).ops
            for op in ops:
                check.op(frame.lsn, op.key, op.value is not None, op.prior)
            state.apply(frame.lsn, ops)
        check.finish(state.digest)
    except BaseException:
        wal.close()
        raise
    return Recovered(manifests, wal, len(frames))


def _create(root: StateRoot, secret: bytes | None) -> tuple[bytes, Manifest]:
    if root.exists(RECORDS) and root.listdir(RECORDS):
        raise StoreCorruptError(f"{root.root}: record files without a MANIFEST")
    if any(img.data[:8] == SEGMENT_MAGIC for img in read_segment_images(root, WAL_DIR)):
        # The first open writes MANIFEST before the log's first segment.
        raise EvidenceError(root.path(MANIFEST), "manifest_missing", "the log holds segments")
    if secret is None:
        root.write_atomic(SECRET, _secrets.token_bytes(SECRET_BYTES))
        secret = read_secret(root)
    assert secret is not None
    manifest = Manifest(
        generation=generation_id(0),
        checkpoint_lsn=0,
        wal_start_seq=1,
        record_count=0,
        record_digest=Digest().text(),
        secret_check=secret_check(secret),
    )
    root.ensure_dir(RECORDS)
    root.write_atomic(MANIFEST, encode_manifest(manifest))
    return secret, manifest


def _load_records(root: StateRoot, options: StoreOptions, state: CommittedState) -> None:
    # One listing serves both the temporary cleanup and the load (the directory can hold
    # tens of thousands of names; listing it is a visible part of the open).
    names, temporaries = record_names(root)
    for name in temporaries:
        root.remove(f"{RECORDS}/{name}", sync_dir=False)
    if temporaries:
        root.sync_dir(RECORDS)
    state.load(load_record_files(root, options.max_record_bytes, names))

"""Opening a state directory: the rollback guard that keeps older builds out, and the migration
of v1/v2 state.

Phases (each durable before the next begins):

1. Read and normalize every legacy record fail-closed (owner-only, identity-stable
   descriptors; 256 MiB monolith ceiling; 2 MiB per normalized record) and preflight the
   configured retention on the in-memory result. Any problem raises ``MigrationError`` and
   nothing has been written.
2. RollbackGuard: create ``records-v2/`` if absent, fsync its parent, write and fsync the guard,
   fsync ``records-v2/``.
3. Commit normalized records in bounded batches (each one transaction; re-running a batch
   writes the same bytes, so a crash between batches repeats the same merge).
4. Completion: the manifest records the migration and requires the guard. Only then does
   ordinary v3 work (recovery, activation, retention) run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config
from ..continuations.keyspace import LIVE, TOMB, bounded_batches
from ..continuations.model import Continuation, encode
from ..continuations.retention import plan_retention, retention_limits, tombstone_of
from ..disk import StateRoot
from ..store import MAX_RECORD_BYTES, Put, RecordStore
from ..store.keys import CLAIM_BINDING, CONTINUATION_IDS, derive_key
from .formats import (
    GUARD,
    GUARD_PATH,
    GUARD_TEXT,
    V1_FILE,
    V2_DIR,
    MigrationError,
    check_guard,
    has_evidence,
    has_v1,
    read_v1,
    read_v2,
    v2_names,
)
from .normalize import merge, normalize

BATCH = 100
Hook = Callable[[str], None]


@dataclass
class MigrationReport:
    migrated: int = 0
    source: str = ""
    fence_installed: bool = False
    batches: int = 0


def guard_present(root: StateRoot) -> bool:
    return root.exists(GUARD_PATH)


def install_rollback_guard(root: StateRoot) -> None:
    """records-v2/ + fsync parent + guard written and fsynced + fsync records-v2/."""
    if not root.exists(V2_DIR):
        root.ensure_dir(V2_DIR)  # fsyncs the parent after mkdir
    root.sync_dir("")
    if not root.exists(GUARD_PATH):
        root.write_atomic(GUARD_PATH, GUARD_TEXT, sync_dir=False)
    root.sync_dir(V2_DIR)


def v3_continuations(store: RecordStore) -> int:
    return len(store.keys(LIVE)) + len(store.keys(TOMB))  # keys only: no record file is read


def open_state(store: RecordStore, config: Config, *, hook: Hook | None = None) -> MigrationReport:
    """Apply the fence/migration rules to a freshly opened store (before any v3 work)."""
    root = store.root
    step = hook or (lambda _name: None)
    report = MigrationReport()
    if root.exists(V2_DIR):
        # A crash inside install_rollback_guard leaves the guard's temporary here, and the store only
        # clears its own directories. Temporaries are never evidence (read_v2 skips them).
        root.remove_temporaries(V2_DIR)
    manifest = store.manifest
    complete = manifest.meta.get("migration") == "complete"
    have_v3 = v3_continuations(store) > 0
    # Refuses a missing guard beside v3 records, and legacy records beside unfenced ones.
    present = check_guard(root, manifest, have_v3=have_v3)
    if manifest.guard_required and not present:
        complete = False  # rollback window: v3 is empty, migrate whatever 0.10 left
    if complete or not has_evidence(root):
        return report

    # Phase 1: read, normalize and preflight; nothing written yet.
    ids_key = derive_key(store.secret, CONTINUATION_IDS)
    mac_key = derive_key(store.secret, CLAIM_BINDING)
    legacy = []
    sources = []
    if has_v1(root):
        legacy += read_v1(root)
        sources.append("v1")
    if v2_names(root):
        legacy += read_v2(root)
        sources.append("v2")
    normalized = merge([normalize(rec, ids_key=ids_key, mac_key=mac_key) for rec in legacy])
    preflight_retention(normalized, config, max_record_bytes=store.options.max_record_bytes)
    step("preflighted")

    # Phase 2: the fence, before anything legacy becomes v3 state.
    install_rollback_guard(root)
    report.fence_installed = True
    step("fenced")

    # Phase 3: bounded, idempotent batches.
    items = sorted(normalized.values(), key=lambda c: c.id)
    encoded = {c.id: encode(c) for c in items}
    # Bounded by bytes as well as count: 100 records of up to 2 MiB would be one transaction
    # far beyond the log's limit.
    budget = max(64 * 1024, store.options.wal.max_payload // 2)
    for batch in bounded_batches([c.id for c in items], lambda cid: len(encoded[cid]) + 256, budget, BATCH):
        store.transact_sync([Put(LIVE + cid, encoded[cid]) for cid in batch])
        report.batches += 1
        step(f"batch-{report.batches}")

    # Phase 4: completion closes the rollback window.
    step("before-manifest")
    meta = dict(store.manifest.meta)
    meta.update({"migration": "complete", "migrated": str(len(items)), "migratedFrom": "+".join(sources)})
    store.update_manifest_meta(meta, guard_required=True)
    step("after-manifest")
    report.migrated = len(items)
    report.source = "+".join(sources)
    return report


def preflight_retention(
    normalized: dict[str, Continuation], config: Config, *, max_record_bytes: int = MAX_RECORD_BYTES
) -> None:
    """Run the configured retention on a copy and size-check what it would write.

    Retention never shrinks an oversized migration: every normalized record was already
    checked against the per-record limit; this checks the tombstones retention would create
    against the limit of the store they will be written to. Raises ``MigrationError`` before
    anything (the fence included) is written.
    """
    now = max((c.updated_at_ms for c in normalized.values()), default=0)
    limits = retention_limits(config.retention)
    plan = plan_retention(normalized.values(), (), now, limits)
    for cid in plan.compact:
        size = len(encode(tombstone_of(normalized[cid])))
        if size > max_record_bytes:
            raise MigrationError(
                f"legacy record {normalized[cid].legacy_id!r}: its retention tombstone of {size} bytes "
                f"exceeds the per-record limit {max_record_bytes}"
            )


class RollbackGuard:
    """Writes ``records-v2/ROLLBACK-GUARD`` (once) before the first native v3 record becomes
    durable, and makes the MANIFEST require it from then on."""

    def __init__(self, store: RecordStore) -> None:
        self.store = store
        self.ready = store.manifest.guard_required and guard_present(store.root)

    def ensure(self) -> None:
        if self.ready:
            return
        install_rollback_guard(self.store.root)
        if not self.store.manifest.guard_required:
            self.store.update_manifest_meta(self.store.manifest.meta, guard_required=True)
        self.ready = True


__all__ = [
    "GUARD",
    "V1_FILE",
    "MigrationError",
    "MigrationReport",
    "RollbackGuard",
    "install_rollback_guard",
    "open_state",
]

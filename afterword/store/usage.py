"""Evidence that a state directory was used, for an open that finds no (complete) MANIFEST.

A directory without a MANIFEST is opened as a new, empty store. That is right only if it
never held state: deleting ``MANIFEST`` and the log of a store that never checkpointed (or
also its record files) would otherwise open as empty and healthy, and every producer retry
would then be answered a second time. Files that only an opened store writes prove it was
used: the secret (a first open marks its work with ``CREATING`` until its MANIFEST is
durable, so a secret without a MANIFEST and without that mark is never a new one), record
files, log slots and repair copies, the log's ``HIGHWATER`` mark (written only once a MANIFEST
is durable, so never by an interrupted first open), the checkpoint catalog, the rollback guard,
stored blobs and payloads. Finding one, the open refuses (``manifest_missing``) and names it.

What cannot be detected here: a directory stripped of every one of those files opens as new.
(A directory moved away leaves nothing at its path; its owner marks the path when it notices,
see ``OwnershipLock.check``.)
"""

from __future__ import annotations

from ..disk import StateRoot, is_temp_name
from ..wal.highwater import HIGHWATER
from .catalog import CATALOG
from .evidence import EvidenceError
from .loading import GUARD_PATH, MANIFEST, RECORDS, SECRET, WAL_DIR

CREATING = "CREATING"  # present only while a first open creates the store
_STORED_DIRS = ("blobs", "payloads")  # blob stores: files named by a digest


def _listed(root: StateRoot, rel: str) -> list[str]:
    if not root.exists(rel):
        return []
    return [name for name in root.listdir(rel) if not is_temp_name(name)]


def use_evidence(root: StateRoot, *, secret_counts: bool) -> str | None:
    """The path of the first file proving ``root`` was opened by a store, or None.

    ``secret_counts`` is False while ``CREATING`` exists: the interrupted first open wrote it.
    """
    if secret_counts and root.exists(SECRET):
        return root.path(SECRET)
    for name in _listed(root, RECORDS):
        return root.path(f"{RECORDS}/{name}")
    for name in _listed(root, WAL_DIR):
        if name.endswith(".seg") or ".broken." in name:
            return root.path(f"{WAL_DIR}/{name}")
    for rel in (HIGHWATER, CATALOG, GUARD_PATH):
        if root.exists(rel):
            return root.path(rel)
    for rel in _STORED_DIRS:
        for name in _listed(root, rel):
            return root.path(f"{rel}/{name}")
    return None


def refuse_if_used(root: StateRoot) -> None:
    """Raise ``EvidenceError`` (``manifest_missing``) naming the evidence when ``root``, which
    has no MANIFEST, holds a file only a used store writes."""
    found = use_evidence(root, secret_counts=not root.exists(CREATING))
    if found is not None:
        raise EvidenceError(
            root.path(MANIFEST),
            "manifest_missing",
            f"the directory was used: {found} exists; its MANIFEST (and log) were removed",
        )

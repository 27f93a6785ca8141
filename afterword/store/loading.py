"""Reading a state directory's committed files: shared by recovery and read-only opens.

Nothing here writes; each function applies the fail-closed rules of ``docs/storage-format.md``.
"""

from __future__ import annotations

import hmac

from ..disk import StateRoot, is_temp_name
from ..wal.errors import WalEvidenceError
from ..wal.highwater import HIGHWATER, HIGHWATER_SIZE, Mark, read_mark
from .codec import (
    MAX_MANIFEST_BYTES,
    Manifest,
    RecordImage,
    decode_manifest,
    decode_record,
    key_from_file_name,
    manifest_checksum,
)
from .errors import StoreCorruptError
from .evidence import EvidenceError

MANIFEST = "MANIFEST"
SECRET = "secret"
RECORDS = "records"
WAL_DIR = "wal"
# The rollback guard of the legacy v2 layout (afterword.legacy): a state file like any other.
GUARD_PATH = "records-v2/ROLLBACK-GUARD"
GUARD_DIR = GUARD_PATH.split("/")[0]
MAX_GUARD_BYTES = 64 * 1024
SECRET_BYTES = 32


def read_manifest(root: StateRoot) -> Manifest | None:
    """The decoded MANIFEST, or None if there is none; its checksum verified.

    A MANIFEST without a checksum was written before MANIFESTs carried one, and is accepted
    only while no ``HIGHWATER`` exists: the build that creates that file seals every
    MANIFEST first, so a bare MANIFEST beside one was edited or restored from elsewhere.
    The open that accepts a bare one rewrites it sealed (``ManifestKeeper.start_high_water``).
    """
    if not root.exists(MANIFEST):
        return None
    manifest = decode_manifest(root.read_file(MANIFEST, max_size=MAX_MANIFEST_BYTES))
    path = root.path(MANIFEST)
    if manifest.checksum:
        if not hmac.compare_digest(manifest.checksum, manifest_checksum(manifest)):
            raise EvidenceError(
                path, "manifest_checksum", "its content does not match its checksum (edited or damaged)"
            )
    elif root.exists(HIGHWATER):
        raise EvidenceError(
            path,
            "manifest_checksum",
            "it carries no checksum, but HIGHWATER shows a build that writes one wrote here",
        )
    return manifest


def read_high_water(root: StateRoot, manifest: Manifest) -> tuple[Mark, str] | None:
    """The mark of the ``HIGHWATER`` the MANIFEST names, and its path (None: names none)."""
    if not manifest.high_water:
        return None
    path = root.path(HIGHWATER)
    if not root.exists(HIGHWATER):
        raise WalEvidenceError(
            path, "high_water_missing", "the MANIFEST names it; it records the acknowledged lsn"
        )
    return read_mark(
        root.read_file(HIGHWATER, max_size=HIGHWATER_SIZE), path, bytes.fromhex(manifest.high_water)
    ), path


def read_secret(root: StateRoot) -> bytes | None:
    """The 32-byte secret, or None if there is none."""
    if not root.exists(SECRET):
        return None
    data = root.read_file(SECRET, max_size=SECRET_BYTES)
    if len(data) != SECRET_BYTES:
        raise StoreCorruptError(f"{root.path(SECRET)}: secret must be {SECRET_BYTES} bytes")
    return data


def check_guard_file(root: StateRoot) -> bool:
    """Hold ``records-v2/`` and its rollback guard, when present, to the rules of every state
    file (``UnsafeStateError`` for a symlink, dangling or not, a non-regular file, a hard link,
    another owner, group or other bits, a swap while read). True if the guard exists."""
    if not root.exists(GUARD_DIR):
        return False
    root.check_dir(GUARD_DIR)
    if not root.exists(GUARD_PATH):
        return False
    root.read_file(GUARD_PATH, max_size=MAX_GUARD_BYTES)
    return True


def record_names(root: StateRoot) -> tuple[list[str], list[str]]:
    """``(record file names, temporaries)`` of ``records/``; anything else is corrupt."""
    listed = root.listdir(RECORDS)
    # Tens of thousands of names: the common case (no temporary, every name a record file)
    # is decided by scans of one joined string in C (NUL cannot occur in a name); a
    # name-by-name pass runs only when something is off.
    joined = "\0" + "\0".join(listed) + "\0"
    temporaries: list[str] = []
    names = listed
    if "\0." in joined:
        temporaries = [name for name in listed if is_temp_name(name)]
        names = [name for name in listed if not is_temp_name(name)]
        joined = "\0" + "\0".join(names) + "\0"
    assert len(names) + len(temporaries) == len(listed)
    if joined.count(".rec\0") != len(names):
        for name in names:
            if not name.endswith(".rec"):
                raise StoreCorruptError(f"{root.path(RECORDS)}/{name}: not a record file")
    return names, temporaries


def load_record_files(
    root: StateRoot, max_record_bytes: int, names: list[str] | None = None
) -> dict[str, RecordImage]:
    """Every record file of ``records/`` decoded and checked (key, name, checksum)."""
    if names is None:
        names, _ = record_names(root)
    records: dict[str, RecordImage] = {}
    for name, data in root.read_all(RECORDS, names, max_size=max_record_bytes + 4096):
        image = decode_record(data, name)
        key_from_file_name(name)
        records[image.key] = image
    return records

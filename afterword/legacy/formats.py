"""The legacy continuation layouts (v1 monolith, v2 records-v2) and their fail-closed reader."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..disk import StateRoot, UnsafeStateError, is_temp_name
from ..errors import StateError
from ..store.codec import FORMAT, Manifest
from ..store.loading import GUARD_PATH as GUARD_PATH
from ..store.loading import check_guard_file

V1_FILE = "continuations.json"
V2_DIR, GUARD = GUARD_PATH.split("/")
MAX_V1_BYTES = 256 * 1024 * 1024
MAX_V2_RECORD_BYTES = 4 * 1024 * 1024  # a v2 file may hold more than v3 allows; checked after
GUARD_TEXT = (
    b"afterword per-record-v3 owns this state directory.\n"
    b"Runtimes of the 0.10 line and older must not open records-v2/ while this file exists.\n"
)


class MigrationError(StateError):
    """Legacy state is unsafe, oversized or inconsistent; nothing was published.

    ``rule`` names the rollback-guard rule a refusal broke (``guard_missing``,
    ``legacy_unfenced``; empty for other problems) and ``path`` the file or directory."""

    def __init__(self, message: str, *, rule: str = "", path: str = "") -> None:
        self.rule = rule
        self.path = path
        super().__init__(message)


class LegacyResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    idempotency_key: str
    payload_hash: str
    payload: Any


class LegacyReceipt(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    delivered_at: str
    channel_id: str | None = None
    delivery_ids: list[str] = []


class LegacyRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    id: str
    state: str
    server_name: str
    kind: Literal["interactive", "detached"]
    mode: str
    conversation_id: str | None = None
    reply_to: str | None = None
    route: str | None = None
    task_key: str
    task_hash: str
    deadline: str
    created_at: str
    updated_at: str
    history_boundary: int | None = None
    result: LegacyResult | None = None
    text: str | None = None
    receipt: LegacyReceipt | None = None
    last_error: str | dict[str, Any] | None = None
    format: str | None = None


class Monolith(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: Literal["monolith-v1"]
    records: list[LegacyRecord]


_v1 = msgspec.json.Decoder(Monolith)
_v2 = msgspec.json.Decoder(LegacyRecord)


def has_v1(root: StateRoot) -> bool:
    return root.exists(V1_FILE)


def v2_names(root: StateRoot) -> list[str]:
    if not root.exists(V2_DIR):
        return []
    return [n for n in root.listdir(V2_DIR) if n.endswith(".json") and not is_temp_name(n)]


def has_evidence(root: StateRoot) -> bool:
    """v1 or v2 records exist (a records-v2/ holding only the guard is not evidence)."""
    return has_v1(root) or bool(v2_names(root))


def check_guard(root: StateRoot, manifest: Manifest, *, have_v3: bool) -> bool:
    """The rollback guard's rules, for the service's open and ``doctor`` alike; True if the
    guard is present.

    The guard and ``records-v2/`` obey every state-file rule (``UnsafeStateError``). Once v3
    records exist, a MANIFEST that requires the guard must find it (``guard_missing``: an older
    runtime may have written ``records-v2/`` since), and legacy records must not sit beside
    v3 records that no guard fences (``legacy_unfenced``).
    """
    present = check_guard_file(root)
    if have_v3 and manifest.guard_required and not present:
        raise MigrationError(
            f"{root.path(GUARD_PATH)}: rollback guard missing while {FORMAT} records exist; "
            "an older runtime may have written records-v2/ since. Restore the complete "
            "pre-upgrade state directory instead of removing the guard",
            rule="guard_missing",
            path=root.path(GUARD_PATH),
        )
    if have_v3 and not (manifest.guard_required or present) and has_evidence(root):
        raise MigrationError(
            f"{root.root}: legacy state beside unfenced v3 records; refusing to merge",
            rule="legacy_unfenced",
            path=root.path(V2_DIR),
        )
    return present


def read_v1(root: StateRoot) -> list[LegacyRecord]:
    """The monolith through an owner-only, identity-stable descriptor, at most 256 MiB."""
    try:
        data = root.read_file(V1_FILE, max_size=MAX_V1_BYTES)
    except UnsafeStateError as exc:
        raise MigrationError(f"unsafe legacy state: {exc}") from None
    try:
        return list(_v1.decode(data).records)
    except msgspec.DecodeError as exc:
        raise MigrationError(f"{root.path(V1_FILE)}: not a valid v1 monolith: {exc}") from None


def read_v2(root: StateRoot) -> list[LegacyRecord]:
    names = v2_names(root)
    try:
        root.check_dir(V2_DIR)
        files = root.read_all(V2_DIR, names, max_size=MAX_V2_RECORD_BYTES)
    except UnsafeStateError as exc:
        raise MigrationError(f"unsafe legacy state: {exc}") from None
    out = []
    for name, data in files:
        try:
            rec = _v2.decode(data)
        except msgspec.DecodeError as exc:
            raise MigrationError(f"{root.path(V2_DIR)}/{name}: not a valid v2 record: {exc}") from None
        if rec.format != "records-v2":
            raise MigrationError(f"{root.path(V2_DIR)}/{name}: format must be records-v2")
        if name != f"{rec.id}.json":
            raise MigrationError(f"{root.path(V2_DIR)}/{name}: holds record {rec.id!r}")
        out.append(rec)
    return out

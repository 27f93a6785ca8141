"""``afterword continuations doctor``: say what is damaged in a state directory, read-only.

Uses :func:`afterword.store.open_readonly`, so it takes no lock, repairs nothing and may
run while a host owns the directory. It reports the first rule the directory breaks, what
that means, and what a restore from backup needs (see ``docs/backup-restore.md``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import msgspec

from ..app.repository import ACTIVATION, LIVE, TOMB
from ..app.statecheck import check_service_state
from ..continuations.model import decode_continuation, decode_tombstone
from ..disk import DiskError, UnsafeStateError
from ..legacy.formats import MigrationError
from ..store import StoreError, StoreView, open_readonly
from ..store.evidence import EvidenceError
from ..store.ownership import check_lock_file
from ..store.survey import describe, survey_short_segments
from ..wal import WalError, WalEvidenceError

_RESTORE_ALL = (
    "Restore the whole state directory from one backup (MANIFEST, secret, records/, wal/ and "
    "blobs/ taken together); files from different backups or times cannot be mixed. Work "
    "acknowledged after that backup is lost."
)
_ADVICE: dict[str, tuple[str, str]] = {
    "secret_missing": (
        "the secret that signed this state is gone; tokens and continuation ids cannot be verified",
        "Restore `secret` from a backup of this state directory (it never changes once written); "
        "if no backup has it, restore the whole directory.",
    ),
    "secret_mismatch": (
        "`secret` is not the one this state was written with",
        "Put back the original `secret` from a backup of this state directory.",
    ),
    "segment_missing": ("a write-ahead log segment holding acknowledged work is gone", _RESTORE_ALL),
    "segment_short": ("a write-ahead log segment was truncated", _RESTORE_ALL),
    "segment_replaced": ("a write-ahead log segment was overwritten or zeroed", _RESTORE_ALL),
    "acknowledged_lost": (
        "the log ends before the last transaction the MANIFEST saw acknowledged",
        _RESTORE_ALL,
    ),
    # Issue 29: the HIGHWATER mark and the MANIFEST checksum.
    "high_water_lost": (
        "the log ends before the last transaction the HIGHWATER mark saw acknowledged "
        "(a segment was rolled back to an older copy, truncated, or its last writes zeroed)",
        _RESTORE_ALL,
    ),
    "high_water_mismatch": ("the log holds another transaction where an acknowledged one was", _RESTORE_ALL),
    "high_water_missing": (
        "HIGHWATER, which records how far the log was acknowledged, is gone",
        _RESTORE_ALL,
    ),
    "high_water_replaced": ("HIGHWATER is not the file this state's MANIFEST names", _RESTORE_ALL),
    "high_water_damaged": ("HIGHWATER holds no whole mark (damaged or truncated)", _RESTORE_ALL),
    "manifest_checksum": ("MANIFEST was edited or damaged (its checksum does not match)", _RESTORE_ALL),
    "record_digest": (
        "record files are missing or older than the MANIFEST and the log account for",
        _RESTORE_ALL,
    ),
    "manifest_behind_records": ("MANIFEST is older than the record files (rolled back)", _RESTORE_ALL),
    "manifest_missing": (
        "MANIFEST is gone although the directory holds files only a used store writes (the path named "
        "above); opening it as a new, empty store would forget everything it acknowledged",
        _RESTORE_ALL,
    ),
    "record_undecodable": (
        "a committed continuation record does not decode, so the service refuses to open over it",
        "Restore the state directory from a backup taken before the record was written; the key "
        "names the record (its file is under records/).",
    ),
    "payload_missing": (
        "the file holding an accepted result's payload is gone; the result could never be delivered",
        "Restore payloads/ (with the rest of the directory) from one backup: " + _RESTORE_ALL,
    ),
    "payload_size": (
        "the file holding an accepted result's payload is not the size it was written with (truncated or replaced)",
        "Restore payloads/ (with the rest of the directory) from one backup: " + _RESTORE_ALL,
    ),
    "guard_missing": (
        "records-v2/ROLLBACK-GUARD is gone while v3 records exist; an older (0.10) runtime may have "
        "written records-v2/ since, and serve refuses to start",
        "Restore the complete state directory from one backup (docs/upgrading.md); do not recreate "
        "the guard by hand.",
    ),
    "legacy_unfenced": (
        "legacy (0.10) records sit beside v3 records with no rollback guard; serve refuses to merge them",
        "Restore the complete state directory from one backup (docs/upgrading.md).",
    ),
    "migration": ("legacy state cannot be migrated (see the message)", "See docs/upgrading.md."),
    "bad_lock_file": (
        "owner.db (the ownership lock) is not an SQLite database; it holds no state",
        "With no host running, delete owner.db; the next start recreates it. No restore needed.",
    ),
    "missing": ("a file or directory the state needs is missing", _RESTORE_ALL),
    "permissive_mode": (
        "a file or directory is readable by other users",
        "chmod 0700 the directories and 0600 the files; no restore needed.",
    ),
    "wrong_owner": (
        "a file or directory belongs to another user",
        "chown it back to the service's user; no restore needed.",
    ),
    "symlink": (
        "a path in the state directory is a symbolic link",
        "Replace the link with the real file, or restore.",
    ),
    "hard_link": (
        "a file has more than one hard link",
        "Replace it with a single-link copy (cp, then mv), or restore.",
    ),
    "not_regular": ("a path that must be a file is something else", _RESTORE_ALL),
    "not_directory": ("a path that must be a directory is something else", _RESTORE_ALL),
    "too_large": ("a file is larger than its format allows (damaged or foreign)", _RESTORE_ALL),
}


_DAMAGED = ("committed state is damaged (a file does not decode or the log is inconsistent)", _RESTORE_ALL)


def fix_for(rule: str) -> str | None:
    """What to do about ``rule``, as doctor says it; None for a rule doctor does not know."""
    advice = _ADVICE.get(rule)
    return advice[1] if advice else None


@dataclass
class Diagnosis:
    state_dir: str
    healthy: bool
    rule: str = ""
    path: str = ""
    problem: str = ""
    meaning: str = ""
    restore: str = ""
    facts: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def diagnose(state_dir: str) -> Diagnosis:
    """Read ``state_dir`` without changing it and say whether it opens, and if not why."""
    state_dir = os.path.abspath(state_dir)
    d = Diagnosis(state_dir, healthy=True)
    d.notes += _side_notes(state_dir)
    try:
        view = open_readonly(state_dir)
    except (EvidenceError, WalEvidenceError, UnsafeStateError) as exc:
        d.healthy, d.rule, d.path, d.problem = False, exc.rule, exc.path, str(exc)
    except (StoreError, WalError, DiskError) as exc:
        d.healthy, d.rule, d.problem = False, "corrupt", str(exc)
    else:
        bad = _undecodable_continuation(view)
        if bad is not None:
            d.healthy, d.rule, d.path = False, "record_undecodable", bad
            d.problem = f"continuation record {bad!r} does not decode"
            d.meaning, d.restore = _ADVICE["record_undecodable"]
            return d
        try:
            _check_service_state(view)
        except (EvidenceError, UnsafeStateError, MigrationError) as exc:
            d.healthy, d.rule, d.path, d.problem = False, exc.rule or "migration", exc.path, str(exc)
            d.meaning, d.restore = _ADVICE.get(d.rule, _DAMAGED)
            return d
        d.facts = {
            "records": len(view),
            "lastLsn": view.lsn,
            "checkpointLsn": view.manifest.checkpoint_lsn,
            "format": view.manifest.format,
            "segments": len(view.manifest.segments),
        }
        d.notes.append(_what_records_count(view))
        if not os.path.exists(os.path.join(state_dir, "MANIFEST")):
            d.notes.append("no MANIFEST yet: the directory was never opened by a host")
        return d
    d.meaning, d.restore = _ADVICE.get(d.rule, _DAMAGED)
    if d.rule == "segment_short":
        # Which lsns the cut left whole, and whether extending the slot keeps every one.
        survey = survey_short_segments(state_dir)
        if survey is not None:
            d.restore = describe(survey)
    return d


def _undecodable_continuation(view: StoreView) -> str | None:
    """The first continuation record the service's index could not load, if any."""
    for prefix, decode in ((LIVE, decode_continuation), (TOMB, decode_tombstone)):
        for record in view.items(prefix):
            try:
                decode(record.value)
            except (msgspec.MsgspecError, ValueError):
                return record.key
    return None


def _check_service_state(view: StoreView) -> None:
    """What the service's open checks beyond the store's rules: the same function, so that
    doctor and serve give one verdict."""
    check_lock_file(view.root)  # what the owner's open demands of owner.db before it locks
    live = [decode_continuation(r.value) for r in view.items(LIVE)]
    v3_records = len(live) + sum(1 for _ in view.items(TOMB))
    check_service_state(view.root, view.manifest, v3_records=v3_records, live=live)


def _what_records_count(view: StoreView) -> str:
    """ "records N" is every key in the store, not the number of continuations: say what they are."""
    counts = {prefix: sum(1 for _ in view.items(prefix)) for prefix in (LIVE, TOMB, ACTIVATION)}
    other = len(view) - sum(counts.values())
    return (
        f"records counts every key in the store: {counts[LIVE]} continuations, {counts[TOMB]} "
        f"compacted by retention, {counts[ACTIVATION]} run activations and {other} others "
        "(conversation history, task journal)"
    )


def _side_notes(state_dir: str) -> list[str]:
    notes: list[str] = []
    wal = os.path.join(state_dir, "wal")
    if os.path.isdir(wal):
        broken = sorted(n for n in os.listdir(wal) if ".broken." in n)
        if broken:
            notes.append(
                f"{len(broken)} repair copies in {wal} ({', '.join(broken[:3])}): an earlier start cut "
                "a torn tail that was never acknowledged, or restored a damaged last write from its "
                "shadow copy; they may be deleted"
            )
    return notes


def render(d: Diagnosis) -> str:
    if d.healthy:
        facts = ", ".join(f"{k} {v}" for k, v in d.facts.items())
        lines = [f"{d.state_dir}: opens cleanly ({facts})"]
    else:
        lines = [
            f"{d.state_dir}: DAMAGED: {d.problem}",
            f"  rule: {d.rule}",
            f"  meaning: {d.meaning}",
            f"  to recover: {d.restore}",
            "  nothing was changed; see docs/backup-restore.md",
        ]
    lines += [f"  note: {n}" for n in d.notes]
    return "\n".join(lines)

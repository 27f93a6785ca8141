"""The ``damage`` family's log rollbacks (issue 29): what a careless restore or an attacker
does to a segment after a kill, and what a power loss cannot explain.

* ``segment-rollback``: a WAL segment copied back from an older copy (the copy taken after
  an earlier acknowledged operation, the previous version of the file and the oldest one);
* ``tail-zeroed``: the last N writes of the log's tail segment (frames and shadow) zeroed,
  N in :data:`ZEROED_WRITES`.

Both leave a log that reads like one a crash tore short, so the MANIFEST (written at
checkpoints and segment starts) cannot tell; the HIGHWATER mark must.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from afterword.wal.layout import SEGMENT_HEADER_SIZE, decode_frame_at, decode_segment_header

ROLLBACK_KINDS = ("segment-rollback", "tail-zeroed")
ZEROED_WRITES = (1, 2, 20)


class _Snapshot(Protocol):
    @property
    def files(self) -> dict[str, bytes]: ...


class _Case(Protocol):
    @property
    def snapshot(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def version(self) -> int: ...


def _segments(files: dict[str, bytes]) -> list[str]:
    return sorted(rel for rel in files if rel.startswith("wal/") and rel.endswith(".seg"))


def write_starts(data: bytes) -> list[int]:
    """Offsets where each write (group commit) of a segment's frames begins."""
    header = decode_segment_header(data)
    if header is None:
        return []
    starts: list[int] = []
    offset = SEGMENT_HEADER_SIZE
    while (frame := decode_frame_at(data, offset, header.salt, len(data))) is not None:
        if frame.lsn == frame.batch_start or not starts:
            starts.append(frame.offset)
        offset = frame.end
    return starts


def tail_segment(files: dict[str, bytes]) -> str | None:
    """The segment holding the log's last frames: the valid header with the highest seq."""
    best: tuple[int, str] | None = None
    for rel in _segments(files):
        header = decode_segment_header(files[rel])
        if header is not None and write_starts(files[rel]) and (best is None or header.seq > best[0]):
            best = (header.seq, rel)
    return None if best is None else best[1]


def rollback_cases(snapshots: Sequence[_Snapshot]) -> list[tuple[int, str, str, int]]:
    """``(snapshot, kind, target, version)`` of every rollback case."""
    out: list[tuple[int, str, str, int]] = []
    for i, snap in enumerate(snapshots):
        for rel in _segments(snap.files):
            # Earlier versions of this file, by the snapshot that first held each.
            versions: list[int] = []
            for j in range(i):
                data = snapshots[j].files.get(rel)
                if data is not None and (not versions or snapshots[versions[-1]].files[rel] != data):
                    versions.append(j)
            older = [j for j in versions if snapshots[j].files[rel] != snap.files[rel]]
            for j in sorted({older[0], older[-1]} if older else set()):
                out.append((i, "segment-rollback", rel, j))
        tail = tail_segment(snap.files)
        if tail is not None:
            writes = len(write_starts(snap.files[tail]))
            out += [(i, "tail-zeroed", tail, n) for n in ZEROED_WRITES if n <= writes]
    return out


def rolled_back(case: _Case, snapshots: Sequence[_Snapshot], files: dict[str, bytes]) -> None:
    """Apply a rollback case to ``files`` (a copy of the case's snapshot) in place."""
    if case.kind == "segment-rollback":
        files[case.target] = snapshots[case.version].files[case.target]
    elif case.kind == "tail-zeroed":
        data = files[case.target]
        start = write_starts(data)[-case.version]
        files[case.target] = data[:start] + bytes(len(data) - start)

"""What survives in a log segment that was cut short (read-only, for the doctor).

A segment slot is preallocated with zeros, so a slot cut below its size (``segment_short``)
holds, up to the cut, exactly what it held before, and the bytes cut away are gone. This
reads the directory as it would be with each short slot extended back to its named size with
zeros and says how far the log then reads, against how far the MANIFEST and the HIGHWATER
mark say it was acknowledged. Nothing is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..disk import DiskError, StateRoot
from ..wal import WalError
from ..wal.reader import read_segment_images
from ..wal.scan import NamedSegment, SegmentImage, check_named, scan_chain
from .errors import StoreError
from .loading import WAL_DIR, read_high_water, read_manifest
from .types import StoreOptions


@dataclass(frozen=True)
class ShortSegments:
    """The short slots (path, size, named size), the lsns that read whole with them
    extended by zeros (``first_lsn..last_lsn``; ``last_lsn < first_lsn``: none), and the
    last acknowledged lsn. ``problem`` is set when even extended the log does not read."""

    slots: tuple[tuple[str, int, int], ...]
    first_lsn: int
    last_lsn: int
    acked_lsn: int
    problem: str = ""

    @property
    def keeps_everything(self) -> bool:
        return not self.problem and self.last_lsn >= self.acked_lsn


def survey_short_segments(state_dir: str, options: StoreOptions | None = None) -> ShortSegments | None:
    """The survey of ``state_dir``'s short segments, or None when it cannot be read that far
    (no MANIFEST, or it or the HIGHWATER mark are themselves damaged)."""
    options = options or StoreOptions()
    try:
        root = StateRoot(os.path.abspath(state_dir), create=False)
        manifest = read_manifest(root)
        if manifest is None:
            return None
        mark = read_high_water(root, manifest)
        images = read_segment_images(root, WAL_DIR)
    except (StoreError, WalError, DiskError):
        return None
    acked = max(manifest.acked_lsn, mark[0].lsn if mark is not None else 0)
    named = [NamedSegment(r.slot, r.seq, int(r.salt, 16), r.first_lsn, r.size) for r in manifest.segments]
    by_slot = {img.slot: img for img in images}
    short: list[tuple[str, int, int]] = []
    for ref in named:
        image = by_slot.get(ref.slot)
        if image is not None and len(image.data) < ref.size:
            short.append((root.path(f"{WAL_DIR}/{ref.slot:08d}.seg"), len(image.data), ref.size))
            by_slot[ref.slot] = SegmentImage(ref.slot, image.data + bytes(ref.size - len(image.data)))
    first = manifest.checkpoint_lsn + 1
    if not short:
        return None
    extended = list(by_slot.values())
    try:
        check_named(named, extended, start_seq=manifest.wal_start_seq, wal_path=root.path(WAL_DIR))
        plan = scan_chain(
            extended,
            start_seq=manifest.wal_start_seq,
            checkpoint_lsn=manifest.checkpoint_lsn,
            max_payload=options.wal.max_payload,
        )
    except WalError as exc:
        return ShortSegments(tuple(short), first, first - 1, acked, str(exc))
    return ShortSegments(tuple(short), first, plan.next_lsn - 1, acked)


def describe(survey: ShortSegments) -> str:
    """What the operator can do, in a sentence or three."""
    cut = "; ".join(f"{path} is {size} bytes, it had {named}" for path, size, named in survey.slots)
    if survey.problem:
        return f"{cut}. Even extended back with zeros the log does not read ({survey.problem})."
    readable = (
        f"lsns {survey.first_lsn}-{survey.last_lsn} read whole"
        if survey.last_lsn >= survey.first_lsn
        else "no transaction after the checkpoint reads whole"
    )
    if survey.keeps_everything:
        grow = " and ".join(f"`truncate -s {named} {path}`" for path, _, named in survey.slots)
        return (
            f"{cut}. Up to the cut the log is intact: {readable}, which covers every "
            f"acknowledged transaction (up to lsn {survey.acked_lsn}). Extend the file back to "
            f"its size with zeros (what a fresh slot holds): {grow}; the next start keeps lsns "
            f"up to {survey.last_lsn} (a frame torn by the cut is cut, a .broken copy kept). "
            "Run doctor again before starting."
        )
    return (
        f"{cut}. Up to the cut {readable}, but lsns {max(survey.last_lsn, survey.first_lsn - 1) + 1}-"
        f"{survey.acked_lsn} were acknowledged and went with the cut; no repair of this "
        "directory brings them back, and the service refuses to open without them. Restore the "
        "whole state directory from one backup; work acknowledged after that backup is lost."
    )

"""Read the live chain of a log without changing anything (no repair, no lock).

Used by read-only opens of a state directory, possibly while its owner is writing: a torn
or still-unsynced tail is simply left out, and nothing on disk is touched.
"""

from __future__ import annotations

from ..disk import StateRoot
from .highwater import Mark, check_mark
from .log_frames import LogFrames
from .scan import NamedSegment, SegmentImage, check_acked, check_named, scan_chain

SEGMENT_SUFFIX = ".seg"


def read_segment_images(root: StateRoot, rel_dir: str) -> list[SegmentImage]:
    """Every ``NNNNNNNN.seg`` slot of ``rel_dir`` as bytes (read-only descriptors)."""
    images: list[SegmentImage] = []
    if not root.exists(rel_dir):
        return images
    for name in root.listdir(rel_dir):
        if not name.endswith(SEGMENT_SUFFIX) or name.startswith("."):
            continue
        slot = int(name[: -len(SEGMENT_SUFFIX)])
        handle = root.open_file(f"{rel_dir}/{name}")
        try:
            size = root.disk.fstat(handle.fd).st_size
            data = root.pread(handle, size, 0)
        finally:
            root.close(handle)
        images.append(SegmentImage(slot, data))
    return images


def read_chain(
    root: StateRoot,
    rel_dir: str,
    *,
    start_seq: int,
    checkpoint_lsn: int,
    max_payload: int,
    named: list[NamedSegment] | None = None,
    acked_lsn: int = 0,
    high_water: tuple[Mark, str] | None = None,
) -> tuple[LogFrames, list[SegmentImage]]:
    """The frames a recovery would replay, and the segment images they came from.

    Raises ``WalCorruptError`` on damage a crash cannot explain, exactly as recovery would;
    a torn tail that recovery would cut is left out here. ``high_water`` is the mark (and
    its file's path) read *before* the segments: a live writer marks only durable writes,
    so what the segments show then reaches it.
    """
    images = read_segment_images(root, rel_dir)
    wal_path = root.path(rel_dir)
    check_named(named or [], images, start_seq=start_seq, wal_path=wal_path)
    plan = scan_chain(images, start_seq=start_seq, checkpoint_lsn=checkpoint_lsn, max_payload=max_payload)
    check_acked(plan.next_lsn, acked_lsn, wal_path)
    if high_water is not None:
        check_mark(high_water[0], plan.frames, plan.next_lsn, high_water[1])
    return plan.frames, images

"""Opening a log: read every slot, check the MANIFEST's evidence, plan the replay, then
restore damaged writes from their shadows and cut torn tails (each logged, ``.broken`` copy
kept). The decisions are ``scan.py``'s; this module carries them out on disk.

:func:`recover` works on a :class:`SegmentLog` through its public surface only: it hands
over each slot file it finds (``adopt_slot``), writes repairs through ``slot_handle``, and
ends with one ``resume`` call that says which lives form the chain and where writing goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .highwater import HighWater, check_mark
from .layout import SEGMENT_HEADER_SIZE, SegmentHeader, decode_segment_header
from .log_frames import LogFrames
from .scan import NamedSegment, ReplayPlan, Restore, SegmentImage, check_acked, check_named, scan_chain
from .segments import SEGMENT_SUFFIX, SegmentLog

log = logging.getLogger("afterword.wal")


def recover(
    segments: SegmentLog,
    *,
    start_seq: int,
    checkpoint_lsn: int,
    named: list[NamedSegment],
    acked_lsn: int,
    before_free: Callable[[list[int]], None] | None,
    high_water: HighWater | None = None,
) -> LogFrames:
    """Bring ``segments`` (fresh, no slot adopted) to the durable end of the log on disk and
    return the frames to replay. Raises before changing anything when the evidence fails."""
    root, rel_dir = segments.root, segments.rel_dir
    root.ensure_dir(rel_dir)
    root.remove_temporaries(rel_dir)
    images: list[SegmentImage] = []
    for name in root.listdir(rel_dir):
        if not name.endswith(SEGMENT_SUFFIX):
            continue
        slot = int(name[: -len(SEGMENT_SUFFIX)])
        handle = root.open_file(segments.slot_rel(slot), writable=True)
        size = root.disk.fstat(handle.fd).st_size
        # A slot of another size was made by another configuration or is damaged; it is
        # never reused, and a named one fails the evidence check below.
        segments.adopt_slot(slot, handle, size)
        images.append(SegmentImage(slot, root.pread(handle, size, 0)))
    wal_path = root.path(rel_dir)
    check_named(named, images, start_seq=start_seq, wal_path=wal_path)
    plan = scan_chain(
        images, start_seq=start_seq, checkpoint_lsn=checkpoint_lsn, max_payload=segments.options.max_payload
    )
    check_acked(plan.next_lsn, acked_lsn, wal_path)
    if high_water is not None:
        check_mark(high_water.mark, plan.frames, plan.next_lsn, high_water.handle.path)
    by_slot = {img.slot: img for img in images}
    headers = _live_headers(images, plan, start_seq)
    for restore in plan.restores:
        _restore(segments, restore, by_slot)
    if plan.repair is not None:
        _repair(segments, plan.repair.slot, plan.repair.start, plan.repair.stop, by_slot)
        log.warning(
            "wal: cut a torn tail of %s (bytes %d-%d) after lsn %d; the MANIFEST records "
            "lsn %d as the last acknowledged, so the cut frames were never acknowledged",
            root.path(segments.slot_rel(plan.repair.slot)),
            plan.repair.start,
            plan.repair.stop,
            plan.next_lsn - 1,
            acked_lsn,
        )
    named_slots = {ref.slot for ref in named}
    freed_named = [slot for slot in plan.free_slots if slot in named_slots]
    if freed_named and before_free is not None:
        before_free(freed_named)
    for slot in plan.free_slots:
        log.warning(
            "wal: freed %s: it held only leftovers of a torn write after lsn %d",
            root.path(segments.slot_rel(slot)),
            plan.next_lsn - 1,
        )
        handle = segments.slot_handle(slot)
        root.pwrite(handle, b"\x00" * SEGMENT_HEADER_SIZE, 0)
        root.fdatasync(handle)
    # Only the live chain counts towards the next seq. A segment past the end (its header
    # durable, the write before it lost) was zeroed above; counting its seq would leave a gap
    # in the chain the next segment extends, which scan_chain rejects.
    next_seq = max((h.seq for h in headers.values()), default=start_seq - 1) + 1
    # A v3 tail (written before shadows) is left as it is: the next write starts a v4 life,
    # so every frame written from now on has a shadow behind its write.
    tail = None
    if plan.tail_header is not None and plan.tail_header.version >= 4:
        assert plan.tail_slot is not None
        tail = (plan.tail_slot, plan.tail_offset)
    segments.resume(headers, next_seq=next_seq, durable_lsn=plan.next_lsn - 1, tail=tail)
    return plan.frames


def _live_headers(images: list[SegmentImage], plan: ReplayPlan, start_seq: int) -> dict[int, SegmentHeader]:
    """Slot -> header of each life of the live chain (every other slot is free)."""
    free = set(plan.free_slots)
    headers: dict[int, SegmentHeader] = {}
    for image in images:
        header = decode_segment_header(image.data)
        if header is not None and header.seq >= start_seq and image.slot not in free:
            headers[image.slot] = header
    assert sorted(h.seq for h in headers.values()) == plan.chain_seqs, "the chain the scan replayed"
    return headers


def _save_broken(segments: SegmentLog, slot: int, images: dict[int, SegmentImage]) -> str:
    root, rel_dir = segments.root, segments.rel_dir
    n = 0
    while root.exists(f"{rel_dir}/{slot:08d}.broken.{n}"):
        n += 1
    root.write_atomic(f"{rel_dir}/{slot:08d}.broken.{n}", images[slot].data)
    return root.path(f"{rel_dir}/{slot:08d}.broken.{n}")


def _restore(segments: SegmentLog, restore: Restore, images: dict[int, SegmentImage]) -> None:
    """Rewrite a damaged write from its shadow, durably, keeping the damaged bytes aside."""
    assert restore.offset + len(restore.data) <= len(images[restore.slot].data), "inside the segment"
    saved = _save_broken(segments, restore.slot, images)
    handle = segments.slot_handle(restore.slot)
    segments.root.pwrite(handle, restore.data, restore.offset)
    segments.root.fdatasync(handle)
    log.warning(
        "wal: restored lsn %d-%d of %s (bytes %d-%d) from the shadow copy of their write: "
        "the frames were damaged after the write reached the disk whole; damaged bytes "
        "saved as %s",
        restore.first_lsn,
        restore.last_lsn,
        segments.root.path(segments.slot_rel(restore.slot)),
        restore.offset,
        restore.offset + len(restore.data),
        saved,
    )


def _repair(segments: SegmentLog, slot: int, start: int, stop: int, images: dict[int, SegmentImage]) -> None:
    """Save the damaged segment aside, then zero the torn tail so it is never reread."""
    assert SEGMENT_HEADER_SIZE <= start <= stop <= len(images[slot].data), "the cut lies after the header"
    _save_broken(segments, slot, images)
    handle = segments.slot_handle(slot)
    segments.root.pwrite(handle, b"\x00" * (stop - start), start)
    segments.root.fdatasync(handle)

"""Opening a log: read every slot, check the MANIFEST's evidence, plan the replay, then
restore damaged writes from their shadows and cut torn tails (each logged, ``.broken`` copy
kept). The decisions are ``scan.py``'s; this module carries them out on disk."""

from __future__ import annotations

import logging
from collections.abc import Callable

from .frame import SEGMENT_HEADER_SIZE, decode_segment_header
from .frames import LogFrames
from .highwater import HighWater, check_mark
from .scan import NamedSegment, Restore, SegmentImage, check_acked, check_named, scan_chain
from .segments import SEGMENT_SUFFIX, SegmentLog, _Segment

log = logging.getLogger("afterword.wal")


class RecoveringLog(SegmentLog):
    """A ``SegmentLog`` that can rebuild its view of the slots from disk (``_recover``)."""

    def _recover(
        self,
        start_seq: int,
        checkpoint_lsn: int,
        named: list[NamedSegment],
        acked_lsn: int,
        before_free: Callable[[list[int]], None] | None,
        high_water: HighWater | None = None,
    ) -> LogFrames:
        root = self.root
        root.ensure_dir(self.rel_dir)
        root.remove_temporaries(self.rel_dir)
        images: list[SegmentImage] = []
        max_seq = start_seq - 1
        for name in root.listdir(self.rel_dir):
            if not name.endswith(SEGMENT_SUFFIX):
                continue
            slot = int(name[: -len(SEGMENT_SUFFIX)])
            handle = root.open_file(self._slot_rel(slot), writable=True)
            size = root.disk.fstat(handle.fd).st_size
            # A slot of another size was made by another configuration or is damaged; it is
            # never reused, and a named one fails the evidence check below.
            self._segments[slot] = _Segment(slot, handle, size)
            images.append(SegmentImage(slot, root.pread(handle, size, 0)))
        wal_path = root.path(self.rel_dir)
        check_named(named, images, start_seq=start_seq, wal_path=wal_path)
        plan = scan_chain(
            images,
            start_seq=start_seq,
            checkpoint_lsn=checkpoint_lsn,
            max_payload=self.options.max_payload,
        )
        check_acked(plan.next_lsn, acked_lsn, wal_path)
        if high_water is not None:
            check_mark(high_water.mark, plan.frames, plan.next_lsn, high_water.handle.path)
        by_slot = {img.slot: img for img in images}
        for slot, seg in self._segments.items():
            image = by_slot.get(slot)
            header = decode_segment_header(image.data) if image is not None else None
            # Only the live chain counts towards the next seq. A segment past the end (its
            # header durable, the write before it lost) is zeroed below; counting its seq would
            # leave a gap in the chain the next segment extends, which scan_chain rejects.
            if header is not None and header.seq >= start_seq and slot not in plan.free_slots:
                max_seq = max(max_seq, header.seq)
                seg.header = header
        for restore in plan.restores:
            self._restore(restore, by_slot)
        if plan.repair is not None:
            self._repair(plan.repair.slot, plan.repair.start, plan.repair.stop, by_slot)
            log.warning(
                "wal: cut a torn tail of %s (bytes %d-%d) after lsn %d; the MANIFEST records "
                "lsn %d as the last acknowledged, so the cut frames were never acknowledged",
                root.path(self._slot_rel(plan.repair.slot)),
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
                root.path(self._slot_rel(slot)),
                plan.next_lsn - 1,
            )
            seg = self._segments[slot]
            root.pwrite(seg.handle, b"\x00" * SEGMENT_HEADER_SIZE, 0)
            root.fdatasync(seg.handle)
            seg.header = None
        self._chain = sorted(
            (s.slot for s in self._segments.values() if s.header is not None),
            key=lambda slot: self._segments[slot].header.seq,  # type: ignore[union-attr]
        )
        self._next_seq = max_seq + 1
        self.next_lsn = plan.next_lsn
        self.durable_lsn = plan.next_lsn - 1
        if plan.tail_header is not None and plan.tail_header.version >= 4:
            self._tail = self._segments[plan.tail_slot]  # type: ignore[index]
            self._tail_offset = plan.tail_offset
        # A v3 tail (written before shadows) is left as it is: the next write starts a v4
        # life, so every frame written from now on has a shadow behind its write.
        for slot in self._chain:
            self._segments[slot].named = True  # on disk already: durable
        return plan.frames

    def _save_broken(self, slot: int, images: dict[int, SegmentImage]) -> str:
        root = self.root
        n = 0
        while root.exists(f"{self.rel_dir}/{slot:08d}.broken.{n}"):
            n += 1
        root.write_atomic(f"{self.rel_dir}/{slot:08d}.broken.{n}", images[slot].data)
        return root.path(f"{self.rel_dir}/{slot:08d}.broken.{n}")

    def _restore(self, restore: Restore, images: dict[int, SegmentImage]) -> None:
        """Rewrite a damaged write from its shadow, durably, keeping the damaged bytes aside."""
        saved = self._save_broken(restore.slot, images)
        seg = self._segments[restore.slot]
        self.root.pwrite(seg.handle, restore.data, restore.offset)
        self.root.fdatasync(seg.handle)
        log.warning(
            "wal: restored lsn %d-%d of %s (bytes %d-%d) from the shadow copy of their write: "
            "the frames were damaged after the write reached the disk whole; damaged bytes "
            "saved as %s",
            restore.first_lsn,
            restore.last_lsn,
            self.root.path(self._slot_rel(restore.slot)),
            restore.offset,
            restore.offset + len(restore.data),
            saved,
        )

    def _repair(self, slot: int, start: int, stop: int, images: dict[int, SegmentImage]) -> None:
        """Save the damaged segment aside, then zero the torn tail so it is never reread."""
        root = self.root
        self._save_broken(slot, images)
        seg = self._segments[slot]
        root.pwrite(seg.handle, b"\x00" * (stop - start), start)
        root.fdatasync(seg.handle)


"""The MANIFEST's one writer: every rewrite (checkpoint, new log segment, released segments,
migration metadata, a clean close) goes through :class:`ManifestKeeper`, under one lock, as
an atomic replace (temporary, fsync, rename, directory fsync)."""

from __future__ import annotations

import secrets as _secrets
import threading
from typing import Any

import msgspec

from ..disk import StateRoot
from ..wal import WriteAheadLog
from ..wal.highwater import HighWater
from .codec import FORMAT, Manifest, SegmentRef, encode_manifest, seal_manifest
from .evidence import secret_check
from .loading import MANIFEST


def generation_id(lsn: int) -> str:
    """A MANIFEST generation: the checkpoint lsn and 64 random bits."""
    return f"{lsn:016x}-{_secrets.token_hex(8)}"


class ManifestKeeper:
    """The current MANIFEST of an open store (``current``) and the way to replace it.

    ``wal`` is attached once the log is open: from then on each MANIFEST names the log's live
    segments and how far it was acknowledged.
    """

    def __init__(self, root: StateRoot, secret: bytes, manifest: Manifest) -> None:
        self.root = root
        self.secret = secret
        self.current = manifest
        self.wal: WriteAheadLog | None = None
        self._lock = threading.Lock()  # writers run in the loop, the log's thread, checkpoints

    def write(self, **changes: Any) -> None:
        """Write a MANIFEST with ``changes`` over the current one (any thread)."""
        with self._lock:
            base = self.current
            wal = self.wal
            fields: dict[str, Any] = {
                "format": FORMAT,
                "acked_lsn": max(base.acked_lsn, wal.durable_lsn) if wal is not None else base.acked_lsn,
                "secret_check": secret_check(self.secret),
            }
            fields.update(changes)
            start = fields.get("wal_start_seq", base.wal_start_seq)
            if "segments" not in changes and wal is not None:
                fields["segments"] = tuple(
                    SegmentRef(
                        slot=r.slot, seq=r.seq, salt=f"{r.salt:016x}", first_lsn=r.first_lsn, size=r.size
                    )
                    for r in wal.live_segments(start)
                )
            fields["generation"] = generation_id(fields.get("checkpoint_lsn", base.checkpoint_lsn))
            manifest = seal_manifest(msgspec.structs.replace(base, **fields))
            self.root.write_atomic(MANIFEST, encode_manifest(manifest))
            self.current = manifest

    def name_new_segment(self) -> None:
        # In the WAL's writing thread: the new life's header is durable; name it before any
        # frame is written into it.
        self.write()

    def start_high_water(self, last_check: int) -> None:
        """Give the open log a new ``HIGHWATER`` marking its durable lsn, then name it.

        A MANIFEST from before checksums is first rewritten sealed, so that no crash leaves
        a bare MANIFEST beside a ``HIGHWATER`` (which ``read_manifest`` refuses). A crash
        before the naming leaves an unnamed file that the next open replaces.
        """
        wal = self.wal
        assert wal is not None
        if not self.current.checksum:
            self.write()
        check = last_check if wal.durable_lsn > self.current.checkpoint_lsn else 0
        file_id = _secrets.token_bytes(16)
        high_water = HighWater.create(self.root, file_id, wal.durable_lsn, check)
        high_water.sync = not wal.options.unsafe_no_fsync
        wal.high_water = high_water
        self.write(high_water=file_id.hex())

    def forget_segments(self, slots: list[int]) -> None:
        keep = tuple(ref for ref in self.current.segments if ref.slot not in slots)
        self.write(segments=keep)

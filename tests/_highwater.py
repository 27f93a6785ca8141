"""Test helpers for the MANIFEST checksum and the HIGHWATER mark (issue 29)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from afterword.wal.highwater import Mark

# The afterword imports sit in the helpers so that a test module using them still collects
# (and its other tests run and fail for what they check) on a build from before issue 29.


def reseal_manifest(path: str, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit the MANIFEST's fields and seal it again, as a forger who recomputes the
    checksum would (the checks behind the checksum are then what stands)."""
    from afterword.store.codec import decode_manifest, manifest_checksum

    mpath = os.path.join(path, "MANIFEST")
    fields = json.loads(Path(mpath).read_bytes())
    edit(fields)
    fields["checksum"] = ""
    fields["checksum"] = manifest_checksum(decode_manifest(json.dumps(fields).encode()))
    Path(mpath).write_text(json.dumps(fields))


def current_mark(path: str) -> Mark:
    from afterword.wal.highwater import HIGHWATER, SLOT_OFFSETS, decode_mark

    data = Path(path, HIGHWATER).read_bytes()
    marks = [m for m in (decode_mark(data, off) for off in SLOT_OFFSETS) if m is not None]
    return max(marks, key=lambda m: m.counter)


def mark_back(path: str, lsn: int) -> None:
    """Leave the mark at ``lsn`` in both slots, as a kill after the segment's fdatasync and
    before the mark of the writes after ``lsn`` leaves it: those writes were durable but
    never acknowledged."""
    from afterword.wal.highwater import HIGHWATER, SLOT_OFFSETS, Mark, encode_mark

    old = current_mark(path)
    with open(os.path.join(path, HIGHWATER), "r+b") as fh:
        for i, off in enumerate(SLOT_OFFSETS):
            fh.seek(off)
            fh.write(encode_mark(Mark(old.file_id, old.counter + 1 + i, lsn, 0)))

"""Persistence models: what a crash may do to an operation no barrier has covered yet.

Coverage is the same in every model (see ``states.py``): a file's writes, truncations and
preallocations are covered by a later fsync or fdatasync of that file; a create, rename,
unlink, mkdir or rmdir is covered by a later fsync of the directory holding the entry (both
directories for a rename). A covered operation always survives. What differs is the fate
of the uncovered ones, each described by an *outcome* code:

``process``
    The process died, the kernel did not: every issued operation survives (outcome KEEP
    only). One state per crash point.
``reorder``
    Power loss with a kernel that writes back in any order: every uncovered operation
    independently survives whole (KEEP) or vanishes (DROP). Survivors apply in issue order,
    so two operations on the same name never swap, but a later rename may survive while the
    create before it does not, and a file's later write may survive while an earlier one is
    lost.
``torn``
    ``reorder``, and an uncovered write may also survive in part: its bytes split at 512-byte
    sector boundaries of the file, each piece new, old, zero-filled or garbage-filled. Damage
    stays inside the bytes the write covered (the disk is assumed to have powersafe
    overwrite: a sector's untouched bytes are never destroyed by a neighbouring write, the
    assumption SQLite also makes by default).
``torn-sector``
    ``torn`` without powersafe overwrite: a zero- or garbage-filled piece takes the rest of
    its sector with it, including bytes written and synced before. Not run by default: it
    describes disks the durability layer does not claim to survive (surviving them needs
    commits padded to whole sectors), and exists to show what such a disk would cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .recorder import DiskOp, Write

SECTOR = 512
KEEP = 0
DROP = 1

# Piece fates inside a torn write.
NEW, OLD, ZERO, GARBAGE = "N", "O", "Z", "G"

# Torn variants enumerated per piece are capped so one large write cannot dominate.
_MAX_PIECES_EXPANDED = 8


def pieces(offset: int, length: int) -> list[tuple[int, int]]:
    """``(start, end)`` byte ranges of a write split at sector boundaries of the file."""
    out: list[tuple[int, int]] = []
    pos, end = offset, offset + length
    while pos < end:
        stop = min(end, (pos // SECTOR + 1) * SECTOR)
        out.append((pos, stop))
        pos = stop
    return out


def torn_variants(n: int) -> list[str]:
    """The partial outcomes of a write of ``n`` pieces, one fate letter per piece.

    Each piece alone zero-filled, garbage-filled or (when there are several) left old; and
    every front-to-back cut (first pieces new, the rest old) as a write interrupted midway.
    """
    if n == 0:
        return []
    picks = range(n) if n <= _MAX_PIECES_EXPANDED else sorted({0, 1, n // 2, n - 2, n - 1})
    out: list[str] = []
    for j in picks:
        for fate in (ZERO, GARBAGE) + ((OLD,) if n > 1 else ()):
            out.append(NEW * j + fate + NEW * (n - j - 1))
    cuts = range(1, n) if n <= _MAX_PIECES_EXPANDED else sorted({1, n // 2, n - 1})
    for j in cuts:
        out.append(NEW * j + OLD * (n - j))
    return out


@dataclass(frozen=True)
class Model:
    """A persistence model; ``outcomes(op)`` counts the fates an uncovered ``op`` may have."""

    name: str
    summary: str
    subsets: bool  # uncovered operations may vanish
    tearing: bool  # uncovered writes may survive in part
    whole_sectors: bool = False  # a damaged piece damages its whole sector

    def outcomes(self, op: DiskOp) -> int:
        if not self.subsets:
            return 1
        if self.tearing and isinstance(op, Write):
            return 2 + len(torn_variants(len(pieces(op.offset, len(op.data)))))
        return 2

    def describe(self, op: DiskOp, outcome: int) -> str:
        if outcome == KEEP:
            return "kept"
        if outcome == DROP:
            return "dropped"
        assert isinstance(op, Write)
        return "torn " + self.torn_fates(op, outcome)

    def torn_fates(self, op: Write, outcome: int) -> str:
        return torn_variants(len(pieces(op.offset, len(op.data))))[outcome - 2]


PROCESS = Model("process", "process killed, kernel survives: every issued operation persists", False, False)
REORDER = Model("reorder", "power loss: each uncovered operation persists whole or not at all", True, False)
TORN = Model("torn", "reorder, plus uncovered writes torn at 512-byte sectors (old/zero/garbage)", True, True)

TORN_SECTOR = Model(
    "torn-sector", "torn without powersafe overwrite: damage spreads to the whole sector", True, True, True
)

MODELS: dict[str, Model] = {m.name: m for m in (PROCESS, REORDER, TORN, TORN_SECTOR)}
DEFAULT_MODELS: tuple[str, ...] = ("process", "reorder", "torn")


def get_model(name: str) -> Model:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown persistence model {name!r}; known: {', '.join(MODELS)}") from None


def product(counts: Sequence[int], cap: int) -> int:
    """The product of ``counts``, saturating at ``cap + 1`` (spaces can be astronomically large)."""
    total = 1
    for c in counts:
        total *= c
        if total > cap:
            return cap + 1
    return total

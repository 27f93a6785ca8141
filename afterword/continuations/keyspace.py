"""Where continuation records live in the record store: the key prefixes of live records,
tombstones and activations, and how a list of records is cut into transactions that fit.

Below both the application (``app/``) and the legacy migration (``legacy/``), which write the
same keys, so neither has to import the other for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

LIVE = "c/"
TOMB = "t/"
ACTIVATION = "a/"


def bounded_batches(
    ids: Sequence[str], size: Callable[[str], int], budget: int, max_count: int
) -> list[list[str]]:
    """Split ``ids`` in order into batches of at most ``max_count`` whose ``size`` sums stay
    within ``budget`` (a single item larger than the budget forms a batch of its own)."""
    out: list[list[str]] = []
    batch: list[str] = []
    used = 0
    for cid in ids:
        n = size(cid)
        if batch and (used + n > budget or len(batch) >= max_count):
            out.append(batch)
            batch, used = [], 0
        batch.append(cid)
        used += n
    if batch:
        out.append(batch)
    return out

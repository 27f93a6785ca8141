"""The optional C frame scan (``_fastscan.c``), built by ``setup.py`` when a compiler is there.

``fast_read_spans`` and ``fast_find_aligned`` are its functions, or None when the module was not
built (no compiler or Python headers at install time) or ``AFTERWORD_PURE_PYTHON_SCAN=1`` is
set; ``frame.read_spans`` and ``frame.find_aligned`` then use their Python loops, which are the
reference the C ones are tested against.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def _load() -> tuple[Callable[..., tuple[int, int, bytes]] | None, Callable[[bytes, bytes, int], int] | None]:
    if os.environ.get("AFTERWORD_PURE_PYTHON_SCAN") == "1":
        return None, None
    try:
        from ._fastscan import find_aligned, read_spans
    except ImportError:
        return None, None
    return read_spans, find_aligned


fast_read_spans, fast_find_aligned = _load()

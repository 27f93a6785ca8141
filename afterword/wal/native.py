"""The optional C frame scan (``_fastscan.c``), built by ``setup.py`` when a compiler is there.

``fast_read_run`` is its ``read_run``, or None when the module was not built (no compiler or
Python headers at install time) or ``AFTERWORD_PURE_PYTHON_SCAN=1`` is set; ``frame.read_run``
then uses its Python loop, which is the reference the C loop is tested against.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def _load() -> Callable[..., tuple[int, int]] | None:
    if os.environ.get("AFTERWORD_PURE_PYTHON_SCAN") == "1":
        return None
    try:
        from ._fastscan import read_run
    except ImportError:
        return None
    return read_run


fast_read_run = _load()

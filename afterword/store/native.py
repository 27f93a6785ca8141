"""The optional C pass of store replay (``_fastreplay.c``), built by ``setup.py`` when a
compiler is there.

``fast_first_pass`` is its function, or None when the module was not built or
``AFTERWORD_PURE_PYTHON_SCAN=1`` is set (the switch that also turns off the WAL's C scan);
``replay.py`` then runs its msgspec loop, which is the reference the C pass is tested against.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

FirstPass = Callable[[list[Any], int, dict[str, int]], "list[Any] | None"]


def _load() -> FirstPass | None:
    if os.environ.get("AFTERWORD_PURE_PYTHON_SCAN") == "1":
        return None
    try:
        from ._fastreplay import first_pass
    except ImportError:
        return None
    return first_pass


fast_first_pass = _load()  # read at each call (``native.fast_first_pass``), so a test can turn it off

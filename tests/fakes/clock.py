"""A controllable millisecond clock for ``open_service(clock_ms=...)``."""

from __future__ import annotations

from afterword.app.service import wall_clock_ms


class Clock:
    """Wall time plus an offset the test advances; ``frozen`` stops the wall-time part."""

    def __init__(self, *, frozen: bool = False) -> None:
        self.offset_ms = 0
        self._frozen_at = wall_clock_ms() if frozen else None

    def __call__(self) -> int:
        base = self._frozen_at if self._frozen_at is not None else wall_clock_ms()
        return base + self.offset_ms

    def advance(self, ms: int) -> None:
        self.offset_ms += ms

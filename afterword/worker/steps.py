"""What every worker step shares: the app's ports, and committing a transition (shielded
from cancellation when it records that a step was interrupted)."""

from __future__ import annotations

import contextlib

import anyio

from ..app.ports import Transition, WorkerPorts
from ..continuations.errors import ContinuationError
from ..continuations.model import Continuation
from ..disk import DiskError
from ..errors import StateError
from ..store import VersionConflict


class BindingInvalid(StateError):
    """Immutable claim metadata failed its HMAC: dead-letter, deliver nothing."""


class Fallback(StateError):
    """Origin context cannot be restored; use the fixed zero-model answer."""


class Steps:
    def __init__(self, ports: WorkerPorts) -> None:
        self.ports = ports

    def now(self) -> int:
        return self.ports.clock_ms()

    async def transition(self, cid: str, fn: Transition) -> Continuation:
        rec, _ = await self.ports.transition(cid, fn)
        return rec

    async def shielded(self, cid: str, fn: Transition) -> None:
        # If this fails too, recovery at the next start reaches the same verdict.
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(5),
            contextlib.suppress(ContinuationError, VersionConflict, DiskError),
        ):
            await self.transition(cid, fn)

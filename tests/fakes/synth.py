"""In-process synthesizers and histories for embedded-host tests (the app handle accepts them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio

from afterword.history import Message
from afterword.worker import SynthesisRequest


class RecordingSynth:
    """Records every request; answers, raises or hangs as configured.

    ``hang_when`` hangs only requests whose payload has that key set truthy, so one test can
    mix hung and quick continuations. A hang lasts until :attr:`release` is set. ``local``
    declares it a local synthesizer (as the template is), so the worker skips ``synthesizing``.
    """

    def __init__(
        self,
        text: str = "Synthesized answer.",
        *,
        error: Exception | None = None,
        hang: bool = False,
        hang_when: str | None = None,
        local: bool = False,
    ) -> None:
        if local:
            self.local = True
        self.text = text
        self.error = error
        self.hang = hang
        self.hang_when = hang_when
        self.calls: list[SynthesisRequest] = []
        self.release = anyio.Event()
        self.on_call: Callable[[SynthesisRequest], None] = lambda _request: None

    async def synthesize(self, request: SynthesisRequest) -> str:
        self.calls.append(request)
        self.on_call(request)
        hang = self.hang or (
            self.hang_when is not None
            and isinstance(request.payload, dict)
            and bool(request.payload.get(self.hang_when))
        )
        if hang:
            await self.release.wait()
        if self.error is not None:
            raise self.error
        return self.text


class AHistoryBackendFailureWithAnExceptionalAndDeliberatelyOverlongNameForBoundingChecks(Exception):
    """Its name is longer than the 64 characters a historyErrorCode may carry."""


class ExplodingHistory:
    """A conversation history whose appends always fail."""

    def __init__(self) -> None:
        self.appends = 0

    async def append(self, conversation_id: str, messages: Sequence[Message]) -> None:
        self.appends += 1
        raise AHistoryBackendFailureWithAnExceptionalAndDeliberatelyOverlongNameForBoundingChecks(
            "disk on fire"
        )

    async def latest(self, conversation_id: str, limit: int) -> list[Message]:
        return []

    def has_message(self, conversation_id: str, message_id: str) -> bool:
        return False


class HangingHistory:
    """A conversation history whose appends never finish (a wedged backend)."""

    def __init__(self) -> None:
        self.appends = 0

    async def append(self, conversation_id: str, messages: Sequence[Message]) -> None:
        self.appends += 1
        await anyio.sleep_forever()

    async def latest(self, conversation_id: str, limit: int) -> list[Message]:
        return []

    def has_message(self, conversation_id: str, message_id: str) -> bool:
        return False

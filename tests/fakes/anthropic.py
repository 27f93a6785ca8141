"""A fake Anthropic Messages endpoint (``POST /v1/messages``)."""

from __future__ import annotations

from typing import Any

from ._http import FakeServer, Reply, Request, _Hang


class FakeAnthropic(FakeServer):
    """Answers every message with ``text`` as one text content block."""

    def __init__(self, text: str = "Here is what the background task found.") -> None:
        super().__init__()
        self.text = text

    def default(self, request: Request) -> Reply | _Hang:
        if request.path != "/v1/messages":
            return Reply(404, {"type": "error", "error": {"type": "not_found_error"}})
        return Reply(
            200,
            {
                "id": f"msg_{len(self.requests)}",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": self.text}],
                "stop_reason": "end_turn",
            },
        )

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.json() for r in list(self.requests)]

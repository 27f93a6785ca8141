"""A fake OpenAI-compatible chat completions endpoint (``POST /v1/chat/completions``)."""

from __future__ import annotations

from typing import Any

from ._http import FakeServer, Reply, Request, _Hang


class FakeOpenAI(FakeServer):
    """Answers every completion with ``text``; scriptable with :meth:`server_error`,
    :meth:`rate_limited`, :meth:`refuse`, :data:`HANG` or a custom :class:`Reply`."""

    def __init__(self, text: str = "Here is what the background task found.") -> None:
        super().__init__()
        self.text = text

    def default(self, request: Request) -> Reply | _Hang:
        if request.path != "/v1/chat/completions":
            return Reply(404, {"error": {"message": "unknown path"}})
        return Reply(
            200,
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.text}}],
            },
        )

    @staticmethod
    def server_error(status: int = 500) -> Reply:
        return Reply(status, {"error": {"message": "upstream failure"}})

    @staticmethod
    def rate_limited(retry_after_s: int) -> Reply:
        return Reply(429, {"error": {"message": "rate limited"}}, {"Retry-After": str(retry_after_s)})

    @staticmethod
    def refuse() -> Reply:
        return Reply(400, {"error": {"message": "bad request"}})

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.json() for r in list(self.requests)]

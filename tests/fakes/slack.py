"""A fake Slack Web API: ``POST /chat.postMessage`` with a bearer token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._http import HANG, FakeServer, Reply, Request, _Hang


class FakeSlack(FakeServer):
    """Accepts posts with the right token and answers ``{"ok": true, "channel", "ts"}``.

    Scriptable per request: :meth:`ok`, :meth:`server_error`, :meth:`rate_limited`,
    :meth:`refuse` (a permanent Slack error), :data:`HANG`, and :meth:`chunk_two_fails`.
    """

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token
        self._ts = 0

    def default(self, request: Request) -> Reply | _Hang:
        return self.ok()(request)

    def ok(self) -> Callable[[Request], Reply]:
        def answer(request: Request) -> Reply:
            if request.headers.get("authorization") != f"Bearer {self.token}":
                return Reply(200, {"ok": False, "error": "invalid_auth"})
            if request.path != "/chat.postMessage":
                return Reply(404, {"ok": False, "error": "unknown_method"})
            body = request.json()
            self._ts += 1
            return Reply(200, {"ok": True, "channel": body["channel"], "ts": f"1700000000.{self._ts:06d}"})

        return answer

    @staticmethod
    def server_error(status: int = 503) -> Reply:
        return Reply(status, {"ok": False, "error": "internal_error"})

    @staticmethod
    def rate_limited(retry_after_s: int) -> Reply:
        return Reply(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(retry_after_s)})

    @staticmethod
    def refuse(error: str = "channel_not_found") -> Reply:
        return Reply(200, {"ok": False, "error": error})

    def chunk_two_fails(self, failure: Reply | None = None) -> None:
        """The first post succeeds, the second fails (a partial multi-chunk answer)."""
        self.script(self.ok(), failure or self.server_error())

    @property
    def posts(self) -> list[dict[str, Any]]:
        return [r.json() for r in list(self.requests)]


__all__ = ["HANG", "FakeSlack"]

"""A fake webhook receiver: answers each POST with ``{"id": "wh-<n>"}``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._http import FakeServer, Reply, Request, _Hang


class FakeWebhook(FakeServer):
    """Scriptable per request: :meth:`ok`, :meth:`server_error`, :meth:`rate_limited`,
    :meth:`refuse` (a 4xx refusal), :data:`HANG`, and :meth:`chunk_two_fails`."""

    def __init__(self) -> None:
        super().__init__()
        self._n = 0

    def default(self, request: Request) -> Reply | _Hang:
        return self.ok()(request)

    def ok(self) -> Callable[[Request], Reply]:
        def answer(request: Request) -> Reply:
            self._n += 1
            return Reply(200, {"id": f"wh-{self._n}"})

        return answer

    @staticmethod
    def server_error(status: int = 503) -> Reply:
        return Reply(status, {"error": "unavailable"})

    @staticmethod
    def rate_limited(retry_after_s: int) -> Reply:
        return Reply(429, {"error": "slow down"}, {"Retry-After": str(retry_after_s)})

    @staticmethod
    def refuse(status: int = 403) -> Reply:
        return Reply(status, {"error": "forbidden"})

    def chunk_two_fails(self, failure: Reply | None = None) -> None:
        self.script(self.ok(), failure or self.server_error())

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.json() for r in list(self.requests)]

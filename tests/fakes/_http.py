"""A tiny scriptable HTTP/1.1 server on 127.0.0.1, running its own event loop in a thread.

Running in a thread (not in the test's event loop) lets one fake serve an in-process service
and a ``serve`` subprocess alike, and keeps serving while a synchronous test waits. Each
request takes the next scripted action, or the fake's default when the script is empty:

* :class:`Reply` answers with a status, a JSON (or raw) body and headers;
* :data:`HANG` records the request and never answers (until the fake stops);
* a callable gets the :class:`Request` and returns one of the above.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Self

import anyio


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = None  # bytes are sent as-is; anything else as JSON
    headers: Mapping[str, str] = field(default_factory=dict)


class _Hang:
    def __repr__(self) -> str:
        return "HANG"


HANG = _Hang()
Action = Reply | _Hang | Callable[[Request], "Reply | _Hang"]


class FakeServer:
    """Base of the fakes: override :meth:`default`; use as a context manager."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._script: deque[Action] = deque()
        self._fallback: Action | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    # -- scripting ---------------------------------------------------------------------------
    def default(self, request: Request) -> Reply | _Hang:
        return Reply(200, {})

    def script(self, *actions: Action) -> None:
        """The next requests take these actions, in order; then the default applies again."""
        with self._lock:
            self._script.extend(actions)

    def always(self, action: Action | None) -> None:
        """Replace the default for every unscripted request (None restores it)."""
        with self._lock:
            self._fallback = action

    def _next_action(self, request: Request) -> Reply | _Hang:
        with self._lock:
            self.requests.append(request)
            action = self._script.popleft() if self._script else (self._fallback or self.default)
        return action(request) if callable(action) else action

    # -- observing ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    async def wait_requests(self, n: int, timeout: float = 10.0) -> None:
        with anyio.fail_after(timeout):
            while self.count < n:
                await anyio.sleep(0.01)

    def wait_requests_sync(self, n: int, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while self.count < n:
            if time.monotonic() > end:
                raise TimeoutError(f"{type(self).__name__}: {self.count} of {n} requests arrived")
            time.sleep(0.01)

    # -- serving -----------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                action = self._next_action(Request(method, path, headers, body))
                if isinstance(action, _Hang):
                    await asyncio.Event().wait()  # until the fake stops and cancels us
                    return
                writer.write(_encode(action))
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    return
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()

    def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._handle(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def start(self) -> Self:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._server = loop.run_until_complete(asyncio.start_server(self._on_connect, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None or self._thread is None:
            return

        async def shutdown() -> None:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            loop.stop()

        loop.call_soon_threadsafe(lambda: loop.create_task(shutdown()))
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _encode(reply: Reply) -> bytes:
    body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
    try:
        reason = HTTPStatus(reply.status).phrase
    except ValueError:
        reason = "Status"
    head = [f"HTTP/1.1 {reply.status} {reason}", f"Content-Length: {len(body)}"]
    if not any(k.lower() == "content-type" for k in reply.headers):
        head.append("Content-Type: application/json")
    head.extend(f"{k}: {v}" for k, v in reply.headers.items())
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

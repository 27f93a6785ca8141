"""``tasks/get`` and ``tasks/cancel`` over the MCP Python SDK 2.x, with a bounded read.

Imported only when the SDK 2.x line is installed (:func:`afterword.worker.taskfollow.load_wire`).
The SDK does the JSON-RPC and the streamable-HTTP transport; afterword adds the tasks
extension's two requests (the SDK ships their 2025-11-25 ancestors only), declares the
extension on every request (SEP-2663 servers refuse task methods otherwise), and gives the SDK
an httpx2 client whose transport stops reading an answer past a byte limit, so a hostile server
cannot make the service buffer hundreds of MiB (the SDK bounds SSE events, not JSON bodies).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Literal

import anyio
import httpx2
import mcp_types
from mcp import Client
from mcp.client.extension import advertise
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import RemoteError
from ..protocol.taskanswers import (
    Answer,
    AnswerOverCap,
    Malformed,
    Unreachable,
    answer_from_error,
    answer_from_result,
    clip,
)

__all__ = ["TASKS_EXTENSION", "McpTaskWire"]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
PROTOCOL = "2026-07-28"  # the tasks extension exists from this revision on


class _Raw(BaseModel):
    """Any JSON object, kept as sent: afterword judges it itself (taskanswers.py)."""

    model_config = ConfigDict(extra="allow")


class _TaskParams(mcp_types.RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(serialization_alias="taskId")


class _GetTask(mcp_types.Request[_TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: _TaskParams
    name_param = "taskId"  # mirrored into Mcp-Name, as SEP-2663 asks for tasks/*


class _CancelTask(mcp_types.Request[_TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: _TaskParams
    name_param = "taskId"


class AnswerOverLimit(httpx2.StreamError, RemoteError):
    """Raised inside the SDK's read; the SDK turns it into an error for that one request. The
    server's fault (a RemoteError), so not named like the caller's ``...TooLarge`` errors."""


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, limit: int, on_exceeded: Any) -> None:
        self._inner = inner
        self._limit = limit
        self._on_exceeded = on_exceeded

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                self._on_exceeded()
                raise AnswerOverLimit(f"answer longer than {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedTransport(httpx2.AsyncBaseTransport):
    """Loopback HTTP without proxies, whose response bodies stop at ``limit`` bytes."""

    def __init__(self, limit: int, tls: ssl.SSLContext) -> None:
        self._inner = httpx2.AsyncHTTPTransport(verify=tls, trust_env=False, retries=0)
        self.limit = limit
        self.exceeded = False

    def _exceeded(self) -> None:
        self.exceeded = True

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        length = response.headers.get("content-length", "")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if (length.isdigit() and int(length) > self.limit) or encoding not in ("", "identity"):
            # Refused unread: a compressed body's decoded size is not bounded by its length.
            if encoding in ("", "identity"):
                self._exceeded()
            await response.aclose()
            raise AnswerOverLimit("answer refused before reading")
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, self.limit, self._exceeded),
            request=request,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class McpTaskWire:
    """One short stateless exchange per request: a fresh client, pinned to 2026-07-28 (no
    discovery round trip), so no connection state outlives a poll."""

    def __init__(self, *, max_answer_bytes: int) -> None:
        self.max_answer_bytes = max_answer_bytes
        # Built once: loading the trust store costs tens of ms, more than a loopback poll.
        self.tls = httpx2.create_ssl_context(trust_env=False)

    async def _send(
        self, url: str, headers: Mapping[str, str], request: _GetTask | _CancelTask, timeout_s: float
    ) -> tuple[dict[str, Any] | None, Answer | None]:
        transport = _CappedTransport(self.max_answer_bytes, self.tls)
        http = httpx2.AsyncClient(
            transport=transport,
            # identity: the read limit must bound the decoded size too (compressed answers are refused)
            headers={
                **{k: v for k, v in headers.items() if k.lower() != "accept-encoding"},
                "accept-encoding": "identity",
            },
            timeout=httpx2.Timeout(timeout_s),
            follow_redirects=False,
            trust_env=False,
        )
        outcome: tuple[dict[str, Any] | None, Answer | None] = (None, Unreachable("no answer"))
        try:
            with anyio.fail_after(timeout_s):
                async with (
                    http,
                    Client(
                        _transport(url, http, self.max_answer_bytes),
                        mode=PROTOCOL,
                        extensions=[advertise(TASKS_EXTENSION)],
                        cache=None,
                        read_timeout_seconds=timeout_s,
                    ) as client,
                ):
                    # Judged here, inside the client: an error leaving it would come out
                    # wrapped in the SDK's task groups.
                    try:
                        reply = await client.session.send_request(
                            request, _Raw, request_read_timeout_seconds=timeout_s
                        )
                        outcome = (dict(reply.model_extra or {}), None)
                    except MCPError as exc:
                        outcome = (None, self._refused(transport, exc))
                    except ValidationError:
                        outcome = (None, Malformed("the answer is not a JSON object"))
        except TimeoutError:
            return None, Unreachable(f"no answer within {timeout_s:g} s")
        except Exception as exc:
            # The SDK's transport task groups wrap a refused or reset connection in groups.
            leaves = list(_leaves(exc))
            if transport.exceeded:
                return None, AnswerOverCap(self.max_answer_bytes)
            if leaves and all(isinstance(leaf, _TRANSIENT) for leaf in leaves):
                return None, Unreachable(type(leaves[0]).__name__)
            if leaves and all(isinstance(leaf, _SHAPE) for leaf in leaves):
                # The SDK choked on what the server sent (its envelope, its framing).
                return None, Malformed(f"the answer could not be read ({type(leaves[0]).__name__})")
            raise
        return outcome

    def _refused(self, transport: _CappedTransport, exc: MCPError) -> Answer:
        if transport.exceeded:
            return AnswerOverCap(self.max_answer_bytes)
        return answer_from_error(exc.error.code, exc.error.message)

    async def get(self, url: str, headers: Mapping[str, str], task_id: str, timeout_s: float) -> Answer:
        raw, failure = await self._send(
            url, headers, _GetTask(params=_TaskParams(task_id=task_id)), timeout_s
        )
        if failure is not None:
            return failure
        return answer_from_result(raw, task_id)

    async def cancel(
        self, url: str, headers: Mapping[str, str], task_id: str, timeout_s: float
    ) -> str | None:
        """Send ``tasks/cancel``; ``None`` when the server accepted it, else why not."""
        _, failure = await self._send(
            url, headers, _CancelTask(params=_TaskParams(task_id=task_id)), timeout_s
        )
        if failure is None:
            return None
        if isinstance(failure, AnswerOverCap):
            return f"the answer was longer than {failure.limit} bytes"
        return clip(getattr(failure, "detail", None) or getattr(failure, "message", None) or "refused", 200)


_SHAPE = (ValueError, KeyError, TypeError)  # pydantic.ValidationError is a ValueError
_TRANSIENT = (
    OSError,
    httpx2.TransportError,
    TimeoutError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _transport(url: str, http: httpx2.AsyncClient, max_event: int) -> Any:
    return streamable_http_client(
        url, http_client=http, terminate_on_close=False, max_sse_event_size=max_event
    )

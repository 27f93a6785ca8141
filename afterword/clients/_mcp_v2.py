"""The host helpers' adapter for the MCP Python SDK 2.x (the primary line).

2.x speaks the stateless 2026-07-28 protocol: :class:`mcp.Client` probes ``server/discover``
and falls back to the ``initialize`` handshake for a server on an older revision, so one
client reaches servers on either SDK line. Its HTTP stack is httpx2; a transport yields
``(read, write)``; timeouts are seconds as floats; a tool result says ``is_error``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, Literal, TextIO
from weakref import WeakKeyDictionary

import httpx2
import mcp_types
from mcp import Client, ClientSession, StdioServerParameters, types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED, INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field

from ..errors import AfterwordError
from .mcp_sdk import HandleCallback, RequestHook, TaskChannelClosed, TaskUnknown

LINE = 2
TASKS = True
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# The SDK's own defaults: connect/write within 30 s, and a response stream may stay quiet for
# up to 5 minutes while a tool works.
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


def default_environment() -> dict[str, str]:
    return get_default_environment()


def stdio_parameters(
    command: str, args: list[str], env: dict[str, str], cwd: str | None
) -> StdioServerParameters:
    return StdioServerParameters(command=command, args=args, env=env, cwd=cwd)


def new_http_client(headers: Mapping[str, str], on_request: RequestHook, timeout: Any) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        headers=dict(headers),
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
        event_hooks={"request": [on_request]},
    )


def stdio_transport(params: StdioServerParameters, errlog: TextIO | None) -> AbstractAsyncContextManager[Any]:
    return stdio_client(params) if errlog is None else stdio_client(params, errlog=errlog)


def http_transport(url: str, client: Any) -> AbstractAsyncContextManager[Any]:
    return streamable_http_client(url, http_client=client)


async def start_session(
    stack: AsyncExitStack,
    transport: AbstractAsyncContextManager[Any],
    read_timeout_s: float | None,
    options: Mapping[str, Any],
) -> ClientSession:
    # Client negotiates the protocol revision (discover, else initialize); its session is the
    # same ClientSession type the 1.x adapter yields, so hosts call one API on both lines.
    client = await stack.enter_async_context(
        Client(transport, read_timeout_seconds=read_timeout_s, **options)
    )
    _clients[client.session] = client
    return client.session


# The Client behind each session open_session yielded: only Client.call_tool hands a claimed
# result to its extension's resolver (ClientSession.call_tool raises UnexpectedClaimedResult).
_clients: WeakKeyDictionary[ClientSession, Client] = WeakKeyDictionary()


async def call_tool(
    session: ClientSession, name: str, arguments: dict[str, Any] | None, options: Mapping[str, Any]
) -> types.CallToolResult:
    client = _clients.get(session)
    if client is None:
        result: types.CallToolResult = await session.call_tool(name, arguments, **options)
        return result
    try:
        return await client.call_tool(name, arguments, **options)
    except _Resolved as resolved:
        return resolved.result


class _Resolved(AfterwordError):
    """Carries the tool result made for a task handle past ``Client.call_tool``, which would
    check it against the tool's output schema: that schema describes the answer that will
    follow, not the acceptance note the model reads now."""

    def __init__(self, result: types.CallToolResult) -> None:
        super().__init__("task handle resolved")
        self.result = result


def tool_result(result: Any) -> tuple[str, bool]:
    call: types.CallToolResult = result
    text = " ".join(block.text for block in call.content if isinstance(block, types.TextContent))
    return text, bool(call.is_error)


class _TaskHandleResult(mcp_types.Result):
    """A ``tools/call`` answered with a task handle. Only the tag is typed: afterword reads the
    other fields itself, so a malformed handle reaches the resolver (and becomes a tool error
    the model reads) instead of failing inside the SDK's parser."""

    model_config = ConfigDict(extra="allow")

    result_type: Literal["task"] = Field(alias="resultType")


class _TasksExtension(ClientExtension):
    """The tasks extension as afterword declares it: a claim on ``resultType: "task"`` whose
    resolver hands the handle to the host helpers (adoption) and returns their tool result."""

    identifier = TASKS_EXTENSION

    def __init__(self, on_handle: HandleCallback) -> None:
        self._on_handle = on_handle

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (
            ResultClaim(
                result_type="task",
                model=_TaskHandleResult,
                resolve=self._resolve,
                protocol_versions=frozenset(MODERN_PROTOCOL_VERSIONS),
            ),
        )

    async def _resolve(self, claimed: _TaskHandleResult, ctx: ClaimContext) -> types.CallToolResult:
        raw = claimed.model_dump(by_alias=True, mode="json")
        text, failed = await self._on_handle(raw, ctx.tool_name)
        raise _Resolved(
            types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=failed)
        )


def tasks_extensions(on_handle: HandleCallback) -> list[Any]:
    return [_TasksExtension(on_handle)]


class _TaskAnswer(mcp_types.Result):
    """A ``tasks/*`` answer with every field kept: afterword checks them itself."""

    model_config = ConfigDict(extra="allow")


class _TaskRequest(mcp_types.Request[dict[str, Any], str]):
    name_param = "taskId"  # SEP-2663 mirrors the task id into Mcp-Name on tasks/*


async def _send(session: Any, method: str, task_id: str, timeout_s: float | None) -> dict[str, Any]:
    try:
        result = await session.send_request(
            _TaskRequest(method=method, params={"taskId": task_id}), _TaskAnswer, timeout_s
        )
    except MCPError as exc:
        if exc.code == INVALID_PARAMS:
            raise TaskUnknown(exc.message[:200]) from None
        if exc.code == CONNECTION_CLOSED:
            raise TaskChannelClosed(exc.message[:200]) from None
        raise
    dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json")
    return dumped


async def get_task(session: Any, task_id: str, timeout_s: float | None) -> dict[str, Any]:
    return await _send(session, "tasks/get", task_id, timeout_s)


async def cancel_task(session: Any, task_id: str, timeout_s: float | None) -> None:
    await _send(session, "tasks/cancel", task_id, timeout_s)

"""The host helpers' adapter for the MCP Python SDK 1.x (from 1.24), for its deprecation window.

1.x speaks the handshake protocol revisions: a ``ClientSession`` is opened and ``initialize``
is sent. Its HTTP stack is httpx; the streamable-HTTP transport yields a third value (the
session id getter) that is dropped here; timeouts are ``timedelta``; a tool result says
``isError``. Type-checked against 2.x in CI, hence the ignores where the lines differ.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from datetime import timedelta
from typing import Any, TextIO

import httpx
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client

from .mcp_sdk import HandleCallback, McpSdkUnavailable, RequestHook

LINE = 1
# SDK 1.x has no client extension API: the tasks extension is never declared, so no server
# answers a tool call with a task handle and there is nothing to adopt or follow.
TASKS = False
HTTP_TIMEOUT = httpx.Timeout(30.0, read=300.0)


def default_environment() -> dict[str, str]:
    return get_default_environment()


def stdio_parameters(
    command: str, args: list[str], env: dict[str, str], cwd: str | None
) -> StdioServerParameters:
    return StdioServerParameters(command=command, args=args, env=env, cwd=cwd)


def new_http_client(headers: Mapping[str, str], on_request: RequestHook, timeout: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        headers=dict(headers),
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
        event_hooks={"request": [on_request]},
    )


def stdio_transport(params: StdioServerParameters, errlog: TextIO | None) -> AbstractAsyncContextManager[Any]:
    return stdio_client(params) if errlog is None else stdio_client(params, errlog=errlog)


@asynccontextmanager
async def http_transport(url: str, client: Any) -> AsyncIterator[tuple[Any, Any]]:
    async with streamable_http_client(url, http_client=client) as streams:
        yield streams[0], streams[1]


async def start_session(
    stack: AsyncExitStack,
    transport: AbstractAsyncContextManager[Any],
    read_timeout_s: float | None,
    options: Mapping[str, Any],
) -> ClientSession:
    read, write = await stack.enter_async_context(transport)
    timeout = None if read_timeout_s is None else timedelta(seconds=read_timeout_s)
    session = await stack.enter_async_context(
        ClientSession(read, write, timeout, **options)  # type: ignore[arg-type]
    )
    await session.initialize()
    return session


def tool_result(result: Any) -> tuple[str, bool]:
    text = " ".join(block.text for block in result.content if isinstance(block, types.TextContent))
    return text, bool(result.isError)


def tasks_extensions(on_handle: HandleCallback) -> list[Any]:
    return []


async def call_tool(
    session: ClientSession, name: str, arguments: dict[str, Any] | None, options: Mapping[str, Any]
) -> Any:
    return await session.call_tool(name, arguments, **options)


async def get_task(session: Any, task_id: str, timeout_s: float | None) -> dict[str, Any]:
    raise McpSdkUnavailable("MCP Tasks need the MCP SDK 2.x (mcp>=2)")


async def cancel_task(session: Any, task_id: str, timeout_s: float | None) -> None:
    raise McpSdkUnavailable("MCP Tasks need the MCP SDK 2.x (mcp>=2)")

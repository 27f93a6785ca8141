"""The host helpers' adapter for the MCP Python SDK 2.x (the primary line).

2.x speaks the stateless 2026-07-28 protocol: :class:`mcp.Client` probes ``server/discover``
and falls back to the ``initialize`` handshake for a server on an older revision, so one
client reaches servers on either SDK line. Its HTTP stack is httpx2; a transport yields
``(read, write)``; timeouts are seconds as floats; a tool result says ``is_error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, TextIO

import httpx2
from mcp import Client, ClientSession, StdioServerParameters, types
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client

from .mcp_sdk import RequestHook

LINE = 2
# The SDK's own defaults: connect/write within 30 s, and a response stream may stay quiet for
# up to 5 minutes while a tool works.
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


def default_environment() -> dict[str, str]:
    return get_default_environment()


def stdio_parameters(command: str, args: list[str], env: dict[str, str], cwd: str | None) -> StdioServerParameters:
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
    client = await stack.enter_async_context(Client(transport, read_timeout_seconds=read_timeout_s, **options))
    return client.session


def tool_result(result: Any) -> tuple[str, bool]:
    call: types.CallToolResult = result
    text = " ".join(block.text for block in call.content if isinstance(block, types.TextContent))
    return text, bool(call.is_error)

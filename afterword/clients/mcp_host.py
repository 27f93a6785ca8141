"""Host helpers over the official ``mcp`` SDK: start MCP clients with the run's capability.

A host begins a run (``service.begin_run``), starts its MCP clients through these helpers,
lets the model call tools, and when every tool call has settled, settles the run::

    binding = service.begin_run(run_id, conversation_id, reply_to)
    async with connect_servers(binding, config) as sessions:
        result = await sessions["work-control"].call_tool("start_job", {...})
        ...
    await settle_run(binding, history, commit=save_turn)

Only servers selected in ``tools.continuationServers`` receive the reserved claim values;
every other server is started with those names removed from its configured environment or
headers, so a value copied into the MCP config (or by a model into a tool argument) carries
no authority. The selection is checked again before any server starts: a remote HTTP or SSE
server never gets a capability, even from a hand-built :class:`~afterword.config.Config`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TextIO

import anyio
import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client

from ..app.binding import RunBinding
from ..config import Config, ConfigError, McpServer, is_loopback_url, select_continuation_servers
from ..errors import CallerError

__all__ = [
    "McpHostError",
    "Settlement",
    "check_selection",
    "connect_servers",
    "http_client",
    "open_session",
    "settle_run",
    "stdio_parameters",
]

# The SDK's own defaults: connect/write within 30 s, and a response stream may stay quiet for
# up to 5 minutes while a tool works.
HTTP_TIMEOUT = httpx.Timeout(30.0, read=300.0)


class McpHostError(CallerError):
    """A helper was asked for something the server entry cannot do (the host's fault)."""


def check_selection(config: Config) -> None:
    """Re-check ``tools.continuationServers`` against the MCP servers; raise ConfigError.

    :func:`afterword.load_config` already did this; repeating it here costs nothing and keeps
    a hand-built or stale Config from handing a capability to SSE or to a remote URL.
    """
    select_continuation_servers(
        config.continuation_servers, config.mcp_servers, mcp_file=config.mcp_config_path or "mcp.json"
    )


def _selected(binding: RunBinding, server: McpServer) -> bool:
    return server.name in binding.servers


def stdio_parameters(
    binding: RunBinding, server: McpServer, *, inherit: Mapping[str, str] | None = None
) -> StdioServerParameters:
    """SDK parameters to spawn a stdio server for this run.

    The environment is ``inherit`` (default: the SDK's short list of safe variables such as
    PATH and HOME), then the server's configured ``env``, with every reserved name removed,
    and finally the reserved claim values when the server is selected. The SDK would add its
    defaults underneath, so the full map is passed to make the order explicit.
    """
    if server.transport != "stdio" or not server.command:
        raise McpHostError(f"server {server.name!r} is not a stdio server")
    base = dict(get_default_environment() if inherit is None else inherit)
    base.update(server.env)
    env = binding.stdio_env(server.name, base)
    return StdioServerParameters(command=server.command, args=list(server.args), env=env, cwd=server.cwd)


def http_client(
    binding: RunBinding, server: McpServer, *, timeout: httpx.Timeout = HTTP_TIMEOUT
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for a streamable-HTTP server, with the run's reserved headers.

    The client never follows redirects and ignores proxy environment variables: either would
    carry the capability headers somewhere other than the configured loopback URL.
    """
    if server.transport != "http" or not server.url:
        raise McpHostError(f"server {server.name!r} is not a streamable HTTP server")
    if _selected(binding, server) and not is_loopback_url(server.url):
        raise ConfigError(
            "tools.continuationServers",
            f"server {server.name!r} is not on a loopback address; it may not receive continuation authority",
        )
    headers = binding.http_headers(server.name, server.headers)
    return httpx.AsyncClient(headers=headers, timeout=timeout, follow_redirects=False, trust_env=False)


@asynccontextmanager
async def open_session(
    binding: RunBinding,
    server: McpServer,
    *,
    errlog: TextIO | None = None,
    read_timeout: timedelta | None = None,
    **session_options: Any,
) -> AsyncIterator[ClientSession]:
    """Start one MCP client for this run and yield its initialized ``ClientSession``.

    ``errlog`` receives a stdio server's stderr (a real file; default: ours).
    ``session_options`` go to ``ClientSession`` (``logging_callback``, ``message_handler``...).
    """
    async with AsyncExitStack() as stack:
        if server.transport == "stdio":
            params = stdio_parameters(binding, server)
            if errlog is not None:
                read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
            else:
                read, write = await stack.enter_async_context(stdio_client(params))
        elif server.transport == "http":
            client = await stack.enter_async_context(http_client(binding, server))
            assert server.url is not None
            read, write, _ = await stack.enter_async_context(
                streamable_http_client(server.url, http_client=client)
            )
        else:
            raise McpHostError(
                f"server {server.name!r} uses {server.transport}; these helpers start stdio and "
                "streamable HTTP servers only"
            )
        session = await stack.enter_async_context(
            ClientSession(read, write, read_timeout_seconds=read_timeout, **session_options)
        )
        await session.initialize()
        yield session


@asynccontextmanager
async def connect_servers(
    binding: RunBinding,
    config: Config,
    names: Sequence[str] | None = None,
    *,
    errlog: TextIO | None = None,
    read_timeout: timedelta | None = None,
) -> AsyncIterator[dict[str, ClientSession]]:
    """Start MCP clients for ``names`` (default: every configured server) for this run.

    Everything that can be refused is refused before the first server starts: the
    continuation selection, unknown names, and transports these helpers cannot start.
    """
    check_selection(config)
    wanted = list(config.mcp_servers) if names is None else list(names)
    servers: list[McpServer] = []
    for name in wanted:
        server = config.mcp_servers.get(name)
        if server is None:
            raise McpHostError(f"server {name!r} is not defined in the MCP config")
        if server.transport not in ("stdio", "http"):
            raise McpHostError(f"server {name!r} uses {server.transport}; it cannot be started here")
        servers.append(server)
    for selected in binding.servers:
        if selected not in config.continuation_servers:
            raise McpHostError(
                f"the run holds a capability for {selected!r}, which this config does not select"
            )
    async with AsyncExitStack() as stack:
        sessions: dict[str, ClientSession] = {}
        for server in servers:
            sessions[server.name] = await stack.enter_async_context(
                open_session(binding, server, errlog=errlog, read_timeout=read_timeout)
            )
        yield sessions


@dataclass(frozen=True)
class Settlement:
    """What settling a run did: the claims it activated and the snapshot bound to them."""

    active_claims: tuple[str, ...]
    snapshot_digest: str | None


Phase = Literal["closed", "finalized", "committed", "activated"]


async def settle_run(
    binding: RunBinding,
    history: Sequence[Mapping[str, Any]],
    commit: Callable[[], Awaitable[None]] | None = None,
    *,
    on_phase: Callable[[Phase, Settlement], None] | None = None,
) -> Settlement:
    """Settle the origin of a run after all its tool calls have returned.

    1. ``closed``: close the capabilities and wait for claims already being admitted;
    2. ``finalized``: bind the origin snapshot (``history`` ends with this turn's
       user/assistant pair) to every active claim;
    3. ``committed``: ``commit()``, the host's own durable commit of the turn;
    4. ``activated``: publish the activation marker.

    ``on_phase`` is told after each phase (for progress display or telemetry). If step 2 or
    3 fails, or the task is cancelled there, the run is abandoned so its claims never wait on
    a turn that was not committed, and the error propagates: the host must fail its turn
    rather than report success.
    """

    def tell(phase: Phase, settlement: Settlement) -> Settlement:
        if on_phase is not None:
            on_phase(phase, settlement)
        return settlement

    settlement = tell("closed", Settlement(active_claims=tuple(await binding.close()), snapshot_digest=None))
    try:
        digest = await binding.finalize(history)
        settlement = tell(
            "finalized", Settlement(active_claims=settlement.active_claims, snapshot_digest=digest)
        )
        if commit is not None:
            await commit()
        tell("committed", settlement)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await binding.abandon()
        raise
    await binding.activate()
    return tell("activated", settlement)

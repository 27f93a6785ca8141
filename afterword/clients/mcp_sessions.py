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

The SDK is the ``afterword[mcp]`` extra, on either line (2.x primary, 1.x from 1.24): what
differs between them is in :mod:`._mcp_v2` and :mod:`._mcp_v1`, picked by
:mod:`.mcp_sdk` from the installed version (docs/mcp.md). Importing this module without the
SDK raises :class:`~afterword.clients.mcp_sdk.McpSdkUnavailable` (an ``ImportError``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol, TextIO

import anyio

from ..config import Config, ConfigError, McpServer, is_loopback_url, select_continuation_servers
from ..errors import CallerError
from ..protocol.headers import RESERVED_HEADERS
from ..protocol.tasks import AdoptedTask, TaskHandle
from .mcp_sdk import RequestHook, load
from .mcp_tasks import TaskAdopting, TaskHost

if TYPE_CHECKING:
    import httpx
    import httpx2
    from mcp import ClientSession, StdioServerParameters

__all__ = [
    "HostRunBinding",
    "McpHostError",
    "Settlement",
    "TaskHost",
    "ToolOutcome",
    "call_tool",
    "check_selection",
    "connect_servers",
    "http_client",
    "open_session",
    "sdk_line",
    "settle_run",
    "stdio_parameters",
    "tool_outcome",
]


class HostRunBinding(Protocol):
    """What these helpers use of a run: the in-process ``RunBinding`` (``service.begin_run``)
    and the host API's ``RemoteRun`` (``HostClient.begin_run``) both satisfy it, so a
    type-checked host passes either."""

    @property
    def servers(self) -> Sequence[str]: ...

    def stdio_env(self, server: str, base_env: Mapping[str, str] | None = None) -> dict[str, str]: ...

    def http_headers(self, server: str, base_headers: Mapping[str, str] | None = None) -> dict[str, str]: ...

    async def adopt_task(self, server: str, handle: TaskHandle) -> AdoptedTask: ...

    async def close(self) -> list[str]: ...

    async def finalize(self, history: Sequence[Mapping[str, Any]]) -> str | None: ...

    async def activate(self) -> None: ...

    async def abandon(self) -> None: ...


_sdk = load()

# The SDK's own defaults: connect/write within 30 s, and a response stream may stay quiet for
# up to 5 minutes while a tool works (an httpx2.Timeout on 2.x, an httpx.Timeout on 1.x).
HTTP_TIMEOUT = _sdk.HTTP_TIMEOUT


def sdk_line() -> int:
    """The major version of the MCP SDK these helpers run on: 2 (primary) or 1."""
    return _sdk.LINE


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


def _selected(binding: HostRunBinding, server: McpServer) -> bool:
    return server.name in binding.servers


def stdio_parameters(
    binding: HostRunBinding, server: McpServer, *, inherit: Mapping[str, str] | None = None
) -> StdioServerParameters:
    """SDK parameters to spawn a stdio server for this run.

    The environment is ``inherit`` (default: the SDK's short list of safe variables such as
    PATH and HOME), then the server's configured ``env``, with every reserved name removed,
    and finally the reserved claim values when the server is selected. The SDK would add its
    defaults underneath, so the full map is passed to make the order explicit.
    """
    if server.transport != "stdio" or not server.command:
        raise McpHostError(f"server {server.name!r} is not a stdio server")
    base = dict(_sdk.default_environment() if inherit is None else inherit)
    base.update(server.env)
    env = binding.stdio_env(server.name, base)
    return _sdk.stdio_parameters(server.command, list(server.args), env, server.cwd)


def _pin_reserved(pinned: Mapping[str, str]) -> RequestHook:
    """A request hook that writes the reserved headers last, on every request.

    The client's default headers are only the first layer: the SDK adds its own per request
    (``Mcp-Method``, ``Mcp-Name``, ``Mcp-Param-*`` mirrored from tool arguments on 2.x) and a
    caller may pass more. Whatever those layers hold under a reserved name is dropped here,
    after they were merged, and the run's own values (none for an unselected server) are set.
    """

    async def hook(request: Any) -> None:
        for name in RESERVED_HEADERS:
            if name in request.headers:
                del request.headers[name]
        request.headers.update(pinned)

    return hook


def http_client(
    binding: HostRunBinding, server: McpServer, *, timeout: httpx2.Timeout | httpx.Timeout = HTTP_TIMEOUT
) -> httpx2.AsyncClient | httpx.AsyncClient:
    """An async HTTP client for a streamable-HTTP server, with the run's reserved headers.

    It is the HTTP stack of the installed SDK line (``httpx2.AsyncClient`` on 2.x,
    ``httpx.AsyncClient`` on 1.x), and ``timeout`` is that stack's ``Timeout``. The reserved
    headers are written on every request after all other headers were merged. The client
    never follows redirects and ignores proxy environment variables: either would carry the
    capability headers somewhere other than the configured loopback URL.
    """
    if server.transport != "http" or not server.url:
        raise McpHostError(f"server {server.name!r} is not a streamable HTTP server")
    if _selected(binding, server) and not is_loopback_url(server.url):
        raise ConfigError(
            "tools.continuationServers",
            f"server {server.name!r} is not on a loopback address; it may not receive continuation authority",
        )
    headers = binding.http_headers(server.name, server.headers)
    pinned = binding.http_headers(server.name, {})
    return _sdk.new_http_client(headers, _pin_reserved(pinned), timeout)


def _seconds(timeout: timedelta | float | None) -> float | None:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else timeout


@asynccontextmanager
async def _start(
    binding: HostRunBinding,
    server: McpServer,
    errlog: TextIO | None,
    read_timeout: timedelta | float | None,
    options: Mapping[str, Any],
) -> AsyncIterator[ClientSession]:
    async with AsyncExitStack() as stack:
        if server.transport == "stdio":
            transport = _sdk.stdio_transport(stdio_parameters(binding, server), errlog)
        elif server.transport == "http":
            client = await stack.enter_async_context(http_client(binding, server))
            assert server.url is not None
            transport = _sdk.http_transport(server.url, client)
        else:
            raise McpHostError(
                f"server {server.name!r} uses {server.transport}; these helpers start stdio and "
                "streamable HTTP servers only"
            )
        yield await _sdk.start_session(stack, transport, _seconds(read_timeout), options)


@asynccontextmanager
async def open_session(
    binding: HostRunBinding,
    server: McpServer,
    *,
    errlog: TextIO | None = None,
    read_timeout: timedelta | float | None = None,
    tasks: TaskHost | None = None,
    **session_options: Any,
) -> AsyncIterator[ClientSession]:
    """Start one MCP client for this run and yield its ready ``ClientSession``.

    On SDK 2.x the client negotiates the protocol revision (``server/discover``, falling back
    to ``initialize``); on 1.x it sends ``initialize``. ``errlog`` receives a stdio server's
    stderr (a real file; default: ours). ``read_timeout`` bounds each response (seconds or a
    ``timedelta``). ``session_options`` go to the SDK's client: ``mcp.Client`` on 2.x,
    ``ClientSession`` on 1.x (``logging_callback``, ``message_handler``, ``client_info``...).

    With ``tasks`` (a running :class:`TaskHost`), the session is owned by the TaskHost, which
    keeps it open after this block while a task it must follow is unfinished; on SDK 2.x a
    selected server is offered the MCP tasks extension (call its tools with :func:`call_tool`).
    """
    if tasks is None:
        async with _start(binding, server, errlog, read_timeout, session_options) as session:
            yield session
        return

    def opener(extensions: list[Any]) -> AbstractAsyncContextManager[ClientSession]:
        options = dict(session_options)
        if extensions:
            options["extensions"] = [*options.get("extensions", ()), *extensions]
        return _start(binding, server, errlog, read_timeout, options)

    adopter: TaskAdopting | None = binding if _selected(binding, server) else None
    # The claim token the server is handed, while the run is open: never echoed back in a report.
    secrets = tuple(v for k, v in binding.stdio_env(server.name, {}).items() if k.endswith("_TOKEN"))
    async with tasks.session(server.name, opener, adopter, secrets) as session:
        yield session


async def call_tool(
    session: ClientSession, name: str, arguments: dict[str, Any] | None = None, **options: Any
) -> Any:
    """Call a tool through a session these helpers opened, on either SDK line.

    On 2.x this goes through the SDK's ``Client``, so a task handle from a selected server is
    adopted (see :class:`TaskHost`) and the call returns an ordinary ``CallToolResult``
    (``ClientSession.call_tool`` itself would raise ``UnexpectedClaimedResult``). ``options``
    are ``call_tool``'s keywords (``read_timeout_seconds``, ``meta``...).
    """
    return await _sdk.call_tool(session, name, arguments, options)


@asynccontextmanager
async def connect_servers(
    binding: HostRunBinding,
    config: Config,
    names: Sequence[str] | None = None,
    *,
    errlog: TextIO | None = None,
    read_timeout: timedelta | float | None = None,
    tasks: TaskHost | None = None,
) -> AsyncIterator[dict[str, ClientSession]]:
    """Start MCP clients for ``names`` (default: every configured server) for this run.

    Everything that can be refused is refused before the first server starts: the
    continuation selection, unknown names, and transports these helpers cannot start.
    ``tasks``: a running :class:`TaskHost` to adopt and follow MCP Tasks (see open_session).
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
                open_session(binding, server, errlog=errlog, read_timeout=read_timeout, tasks=tasks)
            )
        yield sessions


@dataclass(frozen=True)
class ToolOutcome:
    """A tool call's text blocks joined, and whether the server marked the result an error."""

    text: str
    failed: bool


def tool_outcome(result: Any) -> ToolOutcome:
    """Read a ``CallToolResult`` of either SDK line (2.x says ``is_error``, 1.x ``isError``)."""
    text, failed = _sdk.tool_result(result)
    return ToolOutcome(text=text, failed=failed)


@dataclass(frozen=True)
class Settlement:
    """What settling a run did: the claims it activated and the snapshot bound to them."""

    active_claims: tuple[str, ...]
    snapshot_digest: str | None


Phase = Literal["closed", "finalized", "committed", "activated"]


async def settle_run(
    binding: HostRunBinding,
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

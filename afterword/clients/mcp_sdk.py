"""Which MCP Python SDK line is installed, and the one small adapter that speaks it.

The MCP SDK is optional (the ``afterword[mcp]`` extra admits ``mcp>=1.24,<3``): the store, the
service, HTTP and the operator CLI never import it. The host helpers
(:mod:`afterword.clients.mcp_sessions`) import it through :func:`load`, which picks
:mod:`._mcp_v2` (SDK 2.x, primary) or :mod:`._mcp_v1` (SDK 1.x from 1.24) from the installed
distribution's version. Everything that differs between the two lines lives in those two
modules; the rest of the helpers is shared.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from functools import cache
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Protocol, TextIO, cast

from ..errors import RemoteError, StateError

if TYPE_CHECKING:
    import httpx
    import httpx2
    from mcp import ClientSession, StdioServerParameters

__all__ = [
    "INSTALL_HINT",
    "HandleCallback",
    "McpSdkUnavailable",
    "SdkAdapter",
    "TaskChannelClosed",
    "TaskUnknown",
    "installed_line",
    "load",
]

INSTALL_HINT = "pip install 'afterword[mcp]'"
# The lines the adapters speak: 1.24 added streamable_http_client(http_client=...), and 3.x
# does not exist yet. Kept equal to the `mcp` extra in pyproject.toml.
_OLDEST = (1, 24)
_NEXT_MAJOR = 3

RequestHook = Callable[[Any], Awaitable[None]]
# Called with a task handle's wire fields and the name of the tool that answered with it;
# returns the tool result's text for the model and whether it is an error.
HandleCallback = Callable[[dict[str, Any], str], Awaitable[tuple[str, bool]]]


class TaskUnknown(RemoteError):
    """``tasks/get`` was refused as naming no task the server knows (it lost its state)."""


class TaskChannelClosed(RemoteError):
    """The session a task is followed over has ended (a stdio server exited)."""


class McpSdkUnavailable(StateError, ImportError):
    """The MCP SDK this feature needs is not installed, or is a line afterword does not speak.

    An ``ImportError`` too, so ``try: import afterword.mcp_host`` / ``except ImportError``
    works as for any optional dependency.
    """


class SdkAdapter(Protocol):
    """What the host helpers need from an SDK line (implemented by ``_mcp_v1``/``_mcp_v2``)."""

    LINE: int
    HTTP_TIMEOUT: Any

    def default_environment(self) -> dict[str, str]: ...

    def stdio_parameters(
        self, command: str, args: list[str], env: dict[str, str], cwd: str | None
    ) -> StdioServerParameters: ...

    def new_http_client(
        self, headers: Mapping[str, str], on_request: RequestHook, timeout: Any
    ) -> httpx2.AsyncClient | httpx.AsyncClient: ...

    def stdio_transport(
        self, params: StdioServerParameters, errlog: TextIO | None
    ) -> AbstractAsyncContextManager[Any]: ...

    def http_transport(self, url: str, client: Any) -> AbstractAsyncContextManager[Any]: ...

    async def start_session(
        self,
        stack: AsyncExitStack,
        transport: AbstractAsyncContextManager[Any],
        read_timeout_s: float | None,
        options: Mapping[str, Any],
    ) -> ClientSession: ...

    def tool_result(self, result: Any) -> tuple[str, bool]: ...

    # The tasks extension (SEP-2663): 2.x only; on 1.x TASKS is False and nothing is declared.
    TASKS: bool

    def tasks_extensions(self, on_handle: HandleCallback) -> list[Any]: ...

    async def call_tool(
        self, session: ClientSession, name: str, arguments: dict[str, Any] | None, options: Mapping[str, Any]
    ) -> Any: ...

    async def get_task(self, session: Any, task_id: str, timeout_s: float | None) -> dict[str, Any]: ...

    async def cancel_task(self, session: Any, task_id: str, timeout_s: float | None) -> None: ...


def installed_line() -> int:
    """The major version of the installed ``mcp`` distribution (1 or 2).

    Raises :class:`McpSdkUnavailable` when it is missing or outside ``>=1.24,<3``.
    """
    try:
        found = version("mcp")
    except PackageNotFoundError:
        raise McpSdkUnavailable(f"the MCP SDK is not installed; {INSTALL_HINT}") from None
    try:
        major, minor = (int(part) for part in found.split(".")[:2])
    except ValueError:
        raise McpSdkUnavailable(f"cannot read the installed MCP SDK version {found!r}") from None
    if (major, minor) < _OLDEST or major >= _NEXT_MAJOR:
        raise McpSdkUnavailable(
            f"the installed MCP SDK is mcp {found}; afterword speaks mcp>=1.24,<3 ({INSTALL_HINT})"
        )
    return major


@cache
def load() -> SdkAdapter:
    """The adapter for the installed SDK line, imported once."""
    line = installed_line()
    try:
        module = import_module(f"{__package__}._mcp_v{line}")
    except ImportError as exc:
        # Installed metadata without an importable package (a broken or half-removed install).
        raise McpSdkUnavailable(f"the MCP SDK cannot be imported ({exc.name}); {INSTALL_HINT}") from None
    return cast(SdkAdapter, module)

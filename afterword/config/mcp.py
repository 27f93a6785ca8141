"""Reading an MCP config (the common ``mcpServers`` format) and selecting continuation servers.

The MCP config is shared with other MCP clients, so only the ``mcpServers`` object is read and
other top-level keys are left alone. Each server entry is strict, though: an unknown key
could change what the server runs or where it connects, and guessing is how a continuation
capability would end up somewhere it should not.

Entry shapes::

    {"command": "python", "args": ["srv.py"], "env": {...}, "cwd": "./tools"}     # stdio
    {"url": "http://127.0.0.1:9000/mcp", "headers": {...}}                       # streamable HTTP
    {"type": "sse", "url": "http://127.0.0.1:9000/sse"}                          # legacy SSE

``type`` may be ``stdio``, ``http``, ``streamable-http`` or ``sse``; an entry with a ``url``
and no ``type`` is streamable HTTP.

Relative paths resolve beside the MCP config file, whatever the current directory: a stdio
server runs in ``cwd`` (relative to the MCP config's folder) or, without one, in that folder,
so relative ``args`` such as ``["server.py"]`` name files there; a ``command`` containing a
``/`` (``./bin/srv``) is made absolute against that directory, while a bare name (``python3``)
is looked up on ``PATH`` as usual.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import msgspec

from .model import ConfigError, McpServer, McpTransport, display_url, from_validation_error, json_path

__all__ = ["is_loopback_host", "is_loopback_url", "parse_mcp_servers", "select_continuation_servers"]

_TYPES: dict[str, McpTransport] = {
    "stdio": "stdio",
    "http": "http",
    "streamable-http": "http",
    "sse": "sse",
}


class _RawEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    type: str | None = None
    command: str | None = None
    args: list[str] = []
    env: dict[str, Any] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, Any] = {}


def _string_map(value: dict[str, Any], path: str, file: str) -> dict[str, str]:
    # Checked by hand: msgspec reports dict values at ``[...]`` and would lose the key.
    for key, item in value.items():
        if not isinstance(item, str):
            raise ConfigError(json_path(path, key), f"expected str, got {type(item).__name__}", file=file)
    return dict(value)


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` is http(s) to ``localhost`` or a loopback IP address."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not host:
        return False
    return is_loopback_host(host)


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback IP address (any case, no brackets).

    The one loopback rule: the server binds only such a host, and clients send a credential
    only to a URL naming one."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _parse_entry(name: str, raw: Any, path: str, file: str, base_dir: str) -> McpServer:
    try:
        entry = msgspec.convert(raw, _RawEntry)
    except msgspec.ValidationError as err:
        raise from_validation_error(err, path, file=file, type_=_RawEntry) from None
    if entry.type is not None and entry.type not in _TYPES:
        raise ConfigError(
            json_path(path, "type"),
            f"unknown transport {entry.type!r} (expected stdio, http, streamable-http or sse)",
            file=file,
        )
    if entry.command is not None and entry.url is not None:
        raise ConfigError(path, "set either command (stdio) or url (HTTP), not both", file=file)
    transport = _TYPES[entry.type] if entry.type else ("http" if entry.url is not None else "stdio")
    if transport == "stdio":
        if not entry.command:
            raise ConfigError(
                json_path(path, "command"), "a stdio server needs a non-empty command", file=file
            )
        for key in ("url", "headers"):
            if getattr(entry, key):
                raise ConfigError(json_path(path, key), "not valid for a stdio server", file=file)
        cwd = base_dir
        if entry.cwd is not None:
            if not entry.cwd:
                raise ConfigError(json_path(path, "cwd"), "must not be empty", file=file)
            cwd = os.path.normpath(os.path.join(base_dir, entry.cwd))
        command = entry.command
        # Only a path-like command is anchored; a bare name keeps its PATH lookup.
        if "/" in command and not os.path.isabs(command):
            command = os.path.normpath(os.path.join(cwd, command))
        return McpServer(
            name=name,
            transport="stdio",
            command=command,
            args=tuple(entry.args),
            env=_string_map(entry.env, json_path(path, "env"), file),
            cwd=cwd,
        )
    if not entry.url:
        raise ConfigError(json_path(path, "url"), f"an {transport} server needs a url", file=file)
    for key in ("command", "args", "env", "cwd"):
        if getattr(entry, key):
            raise ConfigError(json_path(path, key), f"not valid for an {transport} server", file=file)
    parts = urlsplit(entry.url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(json_path(path, "url"), "must be an absolute http(s) URL", file=file)
    return McpServer(
        name=name,
        transport=transport,
        url=entry.url,
        headers=_string_map(entry.headers, json_path(path, "headers"), file),
    )


def parse_mcp_servers(data: Any, *, file: str) -> dict[str, McpServer]:
    """Parse a decoded MCP config document into servers by name.

    Relative ``cwd`` values resolve against the folder of ``file``. Errors carry paths inside
    the MCP config (``mcpServers.work-control.url``) and ``file``.
    """
    if not isinstance(data, dict):
        raise ConfigError("$", f"expected a JSON object in {file}", file=file)
    if "mcpServers" not in data:
        raise ConfigError("mcpServers", f"required key is missing in {file}", file=file)
    servers = data["mcpServers"]
    if not isinstance(servers, dict):
        raise ConfigError("mcpServers", f"expected an object, got {type(servers).__name__}", file=file)
    base_dir = os.path.dirname(file)
    parsed: dict[str, McpServer] = {}
    for name, raw in servers.items():
        path = json_path("mcpServers", name)
        if not name:
            raise ConfigError(path, "server name must not be empty", file=file)
        parsed[name] = _parse_entry(name, raw, path, file, base_dir)
    return parsed


def select_continuation_servers(
    names: Sequence[str],
    servers: Mapping[str, McpServer],
    *,
    mcp_file: str,
    path: str = "tools.continuationServers",
) -> tuple[str, ...]:
    """Check each selected name against the parsed MCP servers; return the selection.

    Only stdio servers and streamable HTTP servers on a loopback address qualify: the claim
    capability travels in the server's environment or request headers, and must never leave
    the machine. SSE, remote HTTP and names missing from the MCP config are rejected here,
    before any server is started.
    """
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        entry_path = json_path(path, index)
        if name in seen:
            raise ConfigError(entry_path, f"server {name!r} is already listed at [{seen[name]}]")
        seen[name] = index
        server = servers.get(name)
        if server is None:
            raise ConfigError(entry_path, f"server {name!r} is not defined in {mcp_file}")
        if server.transport == "sse":
            raise ConfigError(
                entry_path,
                f"server {name!r} uses SSE; only stdio or loopback streamable HTTP servers "
                "may receive continuation authority",
            )
        if server.transport == "http" and not is_loopback_url(server.url or ""):
            raise ConfigError(
                entry_path,
                f"server {name!r} is remote HTTP ({display_url(server.url or '')}); only stdio or loopback "
                "streamable HTTP servers may receive continuation authority",
            )
    return tuple(names)

"""The rules of the ``continuations`` and ``tools`` blocks, one section at a time.

Each function takes the section's input Struct (``raw.py``) and returns the frozen model value;
every failure is a :class:`ConfigError` naming the JSON path of the first problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from .checks import NAME, check_conversation_id, check_env_name, check_url, resolve_path
from .jsonfile import read_json
from .mcp import parse_mcp_servers, select_continuation_servers
from .model import (
    ConfigError,
    DetachedService,
    McpServer,
    NamedRoute,
    NamedRouteMode,
    SynthesisConfig,
    json_path,
)
from .raw import RawDetachedService, RawNamedRoute, RawSynthesis, RawTools, convert
from .secrets import MIN_DETACHED_TOKEN_CHARS, read_env_secret

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_ANTHROPIC_BASE_URL = "https://api.anthropic.com"
_NAMED_ROUTE_MODES: tuple[NamedRouteMode, ...] = ("notify_if_actionable", "capture", "silent")


def build_named_routes(raw: dict[str, Any], file: str | None) -> dict[str, NamedRoute]:
    routes: dict[str, NamedRoute] = {}
    for name, value in raw.items():
        path = json_path("continuations.namedRoutes", name)
        if not NAME.match(name):
            raise ConfigError(path, "route name must be 1-128 letters, digits, '.', '_' or '-'", file=file)
        route = convert(value, RawNamedRoute, path, file)
        mode_path = json_path(path, "mode")
        cid_path = json_path(path, "conversationId")
        if route.mode == "reply":
            raise ConfigError(
                mode_path,
                "'reply' is not a named-route mode; the host binds reply routes from the originating request",
                file=file,
            )
        if route.mode not in _NAMED_ROUTE_MODES:
            raise ConfigError(
                mode_path,
                f"unknown mode {route.mode!r} (expected notify_if_actionable, capture or silent)",
                file=file,
            )
        mode: NamedRouteMode = route.mode
        if mode == "silent":
            if route.conversation_id is not None:
                raise ConfigError(cid_path, "forbidden for mode 'silent'", file=file)
        elif route.conversation_id is None:
            raise ConfigError(cid_path, f"required for mode {mode!r}", file=file)
        else:
            check_conversation_id(route.conversation_id, cid_path, file)
        routes[name] = NamedRoute(mode=mode, conversation_id=route.conversation_id)
    return routes


def build_detached_services(
    raw: list[RawDetachedService], environ: Mapping[str, str], check_env: bool, file: str | None
) -> dict[str, DetachedService]:
    services: dict[str, DetachedService] = {}
    first_index: dict[str, int] = {}
    env_index: dict[str, int] = {}
    tokens: list[tuple[str, int]] = []
    for index, entry in enumerate(raw):
        path = json_path("continuations.detachedServices", index)
        name_path = json_path(path, "name")
        env_path = json_path(path, "tokenEnv")
        if not NAME.match(entry.name):
            raise ConfigError(
                name_path, "service name must be 1-128 letters, digits, '.', '_' or '-'", file=file
            )
        if entry.name in first_index:
            raise ConfigError(
                name_path,
                f"duplicate service name {entry.name!r} "
                f"(first at detachedServices[{first_index[entry.name]}])",
                file=file,
            )
        first_index[entry.name] = index
        check_env_name(entry.token_env, env_path, file)
        # A shared token would let one service claim as the other.
        if entry.token_env in env_index:
            raise ConfigError(
                env_path,
                f"tokenEnv is shared with detachedServices[{env_index[entry.token_env]}]; "
                "each service needs its own token",
                file=file,
            )
        env_index[entry.token_env] = index
        # An unset variable only disables this service's detached claims (hosts, the demo's
        # interactive runs and the operator CLI never need it); a value that is set but unusable
        # is a mistake worth stopping for.
        if check_env and environ.get(entry.token_env):
            token = read_env_secret(
                entry.token_env, path=env_path, environ=environ, min_chars=MIN_DETACHED_TOKEN_CHARS, file=file
            )
            for other, other_index in tokens:
                if token == other:
                    raise ConfigError(
                        env_path,
                        f"environment variable {entry.token_env} holds the same token as "
                        f"detachedServices[{other_index}]; each service needs its own token",
                        file=file,
                    )
            tokens.append((token, index))
        services[entry.name] = DetachedService(name=entry.name, token_env=entry.token_env)
    return services


_PROVIDER_BASE_URLS = {"openai": DEFAULT_OPENAI_BASE_URL, "anthropic": DEFAULT_ANTHROPIC_BASE_URL}


def build_synthesis(raw: RawSynthesis, file: str | None) -> SynthesisConfig:
    path = "continuations.synthesis"
    if raw.provider == "template":
        # Endpoint settings under the template provider would be silently unused: say so.
        for key, value in (
            ("baseUrl", raw.base_url),
            ("model", raw.model),
            ("apiKeyEnv", raw.api_key_env),
            ("maxTokens", raw.max_tokens),
        ):
            if value is not None:
                raise ConfigError(
                    json_path(path, key), "only valid with provider 'openai' or 'anthropic'", file=file
                )
        return SynthesisConfig()
    if raw.provider not in _PROVIDER_BASE_URLS:
        raise ConfigError(
            json_path(path, "provider"),
            f"unknown provider {raw.provider!r} (expected template, openai or anthropic)",
            file=file,
        )
    provider: Literal["openai", "anthropic"] = "openai" if raw.provider == "openai" else "anthropic"
    if not raw.model:
        raise ConfigError(json_path(path, "model"), f"required for provider {provider!r}", file=file)
    base_url = check_url(raw.base_url or _PROVIDER_BASE_URLS[provider], json_path(path, "baseUrl"), file)
    api_key_env = raw.api_key_env
    if api_key_env is not None:
        check_env_name(api_key_env, json_path(path, "apiKeyEnv"), file)
    max_tokens = 1024
    if raw.max_tokens is not None:
        if provider != "anthropic":
            raise ConfigError(json_path(path, "maxTokens"), "only valid with provider 'anthropic'", file=file)
        if raw.max_tokens < 1:
            raise ConfigError(
                json_path(path, "maxTokens"), f"must be a positive integer, got {raw.max_tokens}", file=file
            )
        max_tokens = raw.max_tokens
    return SynthesisConfig(
        provider=provider, base_url=base_url, model=raw.model, api_key_env=api_key_env, max_tokens=max_tokens
    )


def build_mcp(
    tools: RawTools, config_dir: str, file: str | None
) -> tuple[str | None, dict[str, McpServer], tuple[str, ...]]:
    names = tools.continuation_servers
    if tools.mcp_config_path is None:
        if names:
            raise ConfigError(
                "tools.mcpConfigPath", "required when tools.continuationServers lists servers", file=file
            )
        return None, {}, ()
    mcp_file = resolve_path(config_dir, tools.mcp_config_path, "tools.mcpConfigPath", file)
    document = read_json(mcp_file, "tools.mcpConfigPath", "MCP config", file)
    try:
        servers = parse_mcp_servers(document, file=mcp_file)
    except ConfigError as err:
        # The path points into the MCP config; say which file so the operator can find it.
        raise ConfigError(err.path, f"{err.problem} (in {mcp_file})", file=mcp_file) from None
    try:
        selected = select_continuation_servers(names, servers, mcp_file=mcp_file)
    except ConfigError as err:
        raise ConfigError(err.path, err.problem, file=file) from None
    return mcp_file, servers, selected

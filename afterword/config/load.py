"""Loading and validating the configuration file (docs/design.md, Contracts: configuration).

Two phases. First the document's *shape* is checked by converting it into private input
Structs that forbid unknown keys (msgspec reports the JSON path). Then the *rules* of the spec
are checked one value at a time and the frozen :class:`~afterword.config.model.Config` is
built. Every failure is a :class:`ConfigError` naming the JSON path of the first problem.

The only effects are reading the config file and the MCP config it names, and reading (never
storing) the detached-service tokens from the environment to check that they exist.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from ..errors import CallerError
from .mcp import parse_mcp_servers, select_continuation_servers
from .model import (
    ChannelConfig,
    Config,
    ConfigError,
    DetachedService,
    Limits,
    McpServer,
    NamedRoute,
    NamedRouteMode,
    OutboxChannel,
    Retention,
    SlackChannel,
    SynthesisConfig,
    WebhookChannel,
    from_validation_error,
    json_path,
)

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_STATE_DIR",
    "MIN_DETACHED_TOKEN_CHARS",
    "config_from_mapping",
    "default_config",
    "detached_token",
    "load_config",
    "missing_detached_tokens",
    "read_env_secret",
    "synthesis_api_key",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4319
DEFAULT_STATE_DIR = ".mono-agent/continuations"
DEFAULT_OUTBOX = "outbox.jsonl"
DEFAULT_SLACK_BASE_URL = "https://slack.com/api"
DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_ANTHROPIC_BASE_URL = "https://api.anthropic.com"
MIN_DETACHED_TOKEN_CHARS = 16
# Config files are small; the cap only stops a mistyped path (a device, a huge log) from
# being read whole. The MCP config may be another client's whole settings file.
MAX_CONFIG_BYTES = 16 * 1024 * 1024

_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_NAMED_ROUTE_MODES: tuple[NamedRouteMode, ...] = ("notify_if_actionable", "capture", "silent")
_ADAPTERS = ("outbox", "slack", "webhook")
# Route and service names travel in JSON bodies and in the X-Mono-Agent-Service-Name header.
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAX_CONVERSATION_ID = 1024

_LIMIT_DEFAULTS = Limits()
_RETENTION_DEFAULTS = Retention()


# ---------------------------------------------------------------------------------------------
# Input shape: camelCase, unknown keys rejected. Maps keyed by user-chosen names are typed
# ``dict[str, Any]`` and converted entry by entry, because msgspec reports a dict value's path
# as ``[...]`` and would lose the name the operator needs to see.


class _RawTools(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    mcp_config_path: str | None = None
    continuation_servers: list[str] = []
    # The host's request-context selection is a separate feature: accepted, and deliberately
    # never consulted for continuation authority.
    mcp_request_context_servers: list[str] = []


class _RawLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    max_active_records: int = _LIMIT_DEFAULTS.max_active_records
    max_active_per_origin: int = _LIMIT_DEFAULTS.max_active_per_origin
    max_concurrent: int = _LIMIT_DEFAULTS.max_concurrent
    synthesis_timeout_ms: int = _LIMIT_DEFAULTS.synthesis_timeout_ms
    delivery_timeout_ms: int = _LIMIT_DEFAULTS.delivery_timeout_ms
    operator_page_size: int = _LIMIT_DEFAULTS.operator_page_size
    max_connections: int = _LIMIT_DEFAULTS.max_connections
    body_timeout_ms: int = _LIMIT_DEFAULTS.body_timeout_ms


class _RawRetention(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    terminal_max_records: int = _RETENTION_DEFAULTS.terminal_max_records
    terminal_max_age_ms: int = _RETENTION_DEFAULTS.terminal_max_age_ms
    captured_text_max_records: int = _RETENTION_DEFAULTS.captured_text_max_records
    captured_text_max_age_ms: int = _RETENTION_DEFAULTS.captured_text_max_age_ms


class _RawNamedRoute(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    mode: str
    conversation_id: str | None = None


class _RawDetachedService(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True
):
    name: str
    token_env: str


class _RawSynthesis(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    provider: str = "template"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    max_tokens: int | None = None


class _RawOutbox(
    msgspec.Struct,
    tag="outbox",
    tag_field="adapter",
    frozen=True,
    forbid_unknown_fields=True,
    rename="camel",
    kw_only=True,
):
    path: str | None = None
    allow: list[str] | None = None


class _RawSlack(
    msgspec.Struct,
    tag="slack",
    tag_field="adapter",
    frozen=True,
    forbid_unknown_fields=True,
    rename="camel",
    kw_only=True,
):
    token_env: str
    base_url: str = DEFAULT_SLACK_BASE_URL
    allow: list[str] | None = None


class _RawWebhook(
    msgspec.Struct,
    tag="webhook",
    tag_field="adapter",
    frozen=True,
    forbid_unknown_fields=True,
    rename="camel",
    kw_only=True,
):
    url: str
    headers: dict[str, Any] = {}
    allow: list[str] | None = None


_RawChannel = _RawOutbox | _RawSlack | _RawWebhook


class _RawContinuations(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True
):
    enabled: bool = True
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    state_dir: str = DEFAULT_STATE_DIR
    limits: _RawLimits = _RawLimits()
    retention: _RawRetention = _RawRetention()
    named_routes: dict[str, Any] = {}
    detached_services: list[_RawDetachedService] = []
    synthesis: _RawSynthesis = _RawSynthesis()
    channels: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class _RawConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    tools: _RawTools = _RawTools()
    # UNSET (absent) and an object differ: a present block starts the service.
    continuations: _RawContinuations | msgspec.UnsetType = msgspec.UNSET


def _convert(value: Any, type_: Any, path: str, file: str | None) -> Any:
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as err:
        raise from_validation_error(err, path, file=file) from None


# ---------------------------------------------------------------------------------------------
# Reading files.


class DuplicateKeyError(CallerError, ValueError):
    """A JSON object repeats ``key`` (raised by :func:`unique_object_pairs`)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def unique_object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` object hook that refuses a repeated key instead of letting the last win.

    Two `host` entries in a config, or two `route` fields in a request body, would leave a
    reader unsure which one the service acts on. Shared with the HTTP body checks."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKeyError(key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _read_json(file: str, error_path: str, what: str, error_file: str | None) -> Any:
    """Read and parse ``file``; failures are ConfigErrors at ``error_path`` naming ``file``."""
    try:
        with open(file, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(error_path, f"cannot read {what} {file}: {err.strerror}", file=error_file) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            error_path, f"{what} {file} is larger than {MAX_CONFIG_BYTES} bytes", file=error_file
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(error_path, f"{what} {file} is not UTF-8", file=error_file) from None
    try:
        return json.loads(text, object_pairs_hook=unique_object_pairs, parse_constant=_reject_constant)
    except DuplicateKeyError as err:
        problem = f"{what} {file} is not valid JSON: duplicate key {json.dumps(err.key)}"
        raise ConfigError(error_path, problem, file=error_file) from None
    except ValueError as err:
        raise ConfigError(error_path, f"{what} {file} is not valid JSON: {err}", file=error_file) from None


# ---------------------------------------------------------------------------------------------
# Rules.


def _resolve(base_dir: str, value: str, path: str, file: str | None) -> str:
    if not value:
        raise ConfigError(path, "must not be empty", file=file)
    if "\x00" in value:
        raise ConfigError(path, "must not contain NUL", file=file)
    # normpath, not realpath: a symlinked state directory must reach the disk layer's
    # fail-closed checks instead of being silently followed here.
    return os.path.normpath(os.path.join(base_dir, value))


def _check_conversation_id(value: str, path: str, file: str | None) -> str:
    if not value:
        raise ConfigError(path, "conversation id must be a non-empty string", file=file)
    if len(value) > _MAX_CONVERSATION_ID:
        raise ConfigError(
            path, f"conversation id is longer than {_MAX_CONVERSATION_ID} characters", file=file
        )
    if _CONTROL.search(value):
        raise ConfigError(path, "conversation id must not contain control characters", file=file)
    return value


def _check_url(value: str, path: str, file: str | None) -> str:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise ConfigError(path, "must be an absolute http(s) URL", file=file) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(path, "must be an absolute http(s) URL", file=file)
    return value


def _check_env_name(value: str, path: str, file: str | None) -> str:
    if not _ENV_NAME.match(value):
        raise ConfigError(path, "must be an environment variable name (letters, digits, '_')", file=file)
    return value


def _positive_ints(raw: msgspec.Struct, path: str, file: str | None) -> dict[str, int]:
    values: dict[str, int] = {}
    for field in msgspec.structs.fields(type(raw)):
        value = getattr(raw, field.name)
        if value < 1:
            raise ConfigError(
                json_path(path, field.encode_name), f"must be a positive integer, got {value}", file=file
            )
        values[field.name] = value
    return values


def _host(value: str, file: str | None) -> str:
    host = value.lower()
    if host not in _LOOPBACK_HOSTS:
        raise ConfigError(
            "continuations.host",
            f"{value!r} is not a loopback address; use localhost, 127.0.0.1 or ::1",
            file=file,
        )
    return host


def _port(value: int, file: str | None) -> int:
    if value == 0:
        raise ConfigError(
            "continuations.port",
            "ephemeral port 0 is rejected; result/status URLs and operator access must survive restarts",
            file=file,
        )
    if not 1 <= value <= 65535:
        raise ConfigError("continuations.port", f"must be from 1 through 65535, got {value}", file=file)
    return value


def _named_routes(raw: dict[str, Any], file: str | None) -> dict[str, NamedRoute]:
    routes: dict[str, NamedRoute] = {}
    for name, value in raw.items():
        path = json_path("continuations.namedRoutes", name)
        if not _NAME.match(name):
            raise ConfigError(path, "route name must be 1-128 letters, digits, '.', '_' or '-'", file=file)
        route = _convert(value, _RawNamedRoute, path, file)
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
            _check_conversation_id(route.conversation_id, cid_path, file)
        routes[name] = NamedRoute(mode=mode, conversation_id=route.conversation_id)
    return routes


def read_env_secret(
    env_name: str, *, path: str, environ: Mapping[str, str], min_chars: int = 1, file: str | None = None
) -> str:
    """Read a credential from the environment. Errors name the variable, never its value.

    The value must be printable ASCII without spaces (it travels as ``Bearer <value>``) and
    hold at least ``min_chars`` characters.
    """
    value = environ.get(env_name)
    if value is None or value == "":
        raise ConfigError(path, f"environment variable {env_name} is not set", file=file)
    if len(value) < min_chars:
        raise ConfigError(
            path, f"environment variable {env_name} must hold at least {min_chars} characters", file=file
        )
    if not all(33 <= ord(char) <= 126 for char in value):
        raise ConfigError(
            path, f"environment variable {env_name} must hold printable ASCII without spaces", file=file
        )
    return value


def _detached_services(
    raw: list[_RawDetachedService], environ: Mapping[str, str], check_env: bool, file: str | None
) -> dict[str, DetachedService]:
    services: dict[str, DetachedService] = {}
    first_index: dict[str, int] = {}
    env_index: dict[str, int] = {}
    tokens: list[tuple[str, int]] = []
    for index, entry in enumerate(raw):
        path = json_path("continuations.detachedServices", index)
        name_path = json_path(path, "name")
        env_path = json_path(path, "tokenEnv")
        if not _NAME.match(entry.name):
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
        _check_env_name(entry.token_env, env_path, file)
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


def _synthesis(raw: _RawSynthesis, file: str | None) -> SynthesisConfig:
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
    base_url = _check_url(raw.base_url or _PROVIDER_BASE_URLS[provider], json_path(path, "baseUrl"), file)
    api_key_env = raw.api_key_env
    if api_key_env is not None:
        _check_env_name(api_key_env, json_path(path, "apiKeyEnv"), file)
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


def _allow(raw: list[str] | None, path: str, file: str | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    for index, entry in enumerate(raw):
        _check_conversation_id(entry, json_path(path, index), file)
    return tuple(raw)


def _string_map(raw: dict[str, Any], path: str, file: str | None) -> dict[str, str]:
    for key, value in raw.items():
        if not isinstance(value, str):
            raise ConfigError(json_path(path, key), f"expected str, got {type(value).__name__}", file=file)
    return dict(raw)


def _channels(
    raw: dict[str, Any] | msgspec.UnsetType, config_dir: str, file: str | None
) -> dict[str, ChannelConfig]:
    if isinstance(raw, msgspec.UnsetType):
        return {"*": OutboxChannel(path=os.path.join(config_dir, DEFAULT_OUTBOX))}
    if not raw:
        raise ConfigError(
            "continuations.channels",
            "needs at least one channel (omit the block for the default outbox)",
            file=file,
        )
    channels: dict[str, ChannelConfig] = {}
    for key, value in raw.items():
        path = json_path("continuations.channels", key)
        if key != "*" and (not key or ":" in key):
            raise ConfigError(
                path, "channel key must be '*' or a conversation id's first segment (no ':')", file=file
            )
        if (
            isinstance(value, dict)
            and isinstance(value.get("adapter"), str)
            and value["adapter"] not in _ADAPTERS
        ):
            raise ConfigError(
                json_path(path, "adapter"),
                f"unknown adapter {value['adapter']!r} (expected outbox, slack or webhook)",
                file=file,
            )
        entry = _convert(value, _RawChannel, path, file)
        allow = _allow(entry.allow, json_path(path, "allow"), file)
        channel: ChannelConfig
        if isinstance(entry, _RawOutbox):
            outbox = DEFAULT_OUTBOX if entry.path is None else entry.path
            channel = OutboxChannel(
                path=_resolve(config_dir, outbox, json_path(path, "path"), file), allow=allow
            )
        elif isinstance(entry, _RawSlack):
            channel = SlackChannel(
                base_url=_check_url(entry.base_url, json_path(path, "baseUrl"), file).rstrip("/"),
                token_env=_check_env_name(entry.token_env, json_path(path, "tokenEnv"), file),
                allow=allow,
            )
        else:
            channel = WebhookChannel(
                url=_check_url(entry.url, json_path(path, "url"), file),
                headers=_string_map(entry.headers, json_path(path, "headers"), file),
                allow=allow,
            )
        channels[key] = channel
    return channels


def _mcp(
    tools: _RawTools, config_dir: str, file: str | None
) -> tuple[str | None, dict[str, McpServer], tuple[str, ...]]:
    names = tools.continuation_servers
    if tools.mcp_config_path is None:
        if names:
            raise ConfigError(
                "tools.mcpConfigPath", "required when tools.continuationServers lists servers", file=file
            )
        return None, {}, ()
    mcp_file = _resolve(config_dir, tools.mcp_config_path, "tools.mcpConfigPath", file)
    document = _read_json(mcp_file, "tools.mcpConfigPath", "MCP config", file)
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


# ---------------------------------------------------------------------------------------------
# Public entry points.


def config_from_mapping(
    data: Mapping[str, Any],
    base_dir: str,
    *,
    environ: Mapping[str, str] | None = None,
    config_path: str | None = None,
    check_secrets: bool = True,
) -> Config:
    """Validate an already-decoded config document; relative paths resolve against ``base_dir``.

    ``check_secrets=False`` skips checking the credential variables that are set (the operator
    CLI needs the host, port and state directory, never a detached-service token).

    Raises:
        ConfigError: the first invalid value, by JSON path.
    """
    env = os.environ if environ is None else environ
    config_dir = os.path.abspath(base_dir)
    file = config_path
    if not isinstance(data, Mapping):
        raise ConfigError("$", f"expected a JSON object, got {type(data).__name__}", file=file)
    raw: _RawConfig = _convert(dict(data), _RawConfig, "", file)
    present = not isinstance(raw.continuations, msgspec.UnsetType)
    block = raw.continuations if not isinstance(raw.continuations, msgspec.UnsetType) else _RawContinuations()
    # The service runs when its block is present or a server is selected, unless switched off.
    enabled = (present or bool(raw.tools.continuation_servers)) and block.enabled

    host = _host(block.host, file)
    port = _port(block.port, file)
    state_dir = _resolve(config_dir, block.state_dir, "continuations.stateDir", file)
    limits = Limits(**_positive_ints(block.limits, "continuations.limits", file))
    retention = Retention(**_positive_ints(block.retention, "continuations.retention", file))
    named_routes = _named_routes(block.named_routes, file)
    # A disabled service never authenticates detached callers, so their tokens need not be set.
    detached = _detached_services(block.detached_services, env, enabled and check_secrets, file)
    synthesis = _synthesis(block.synthesis, file)
    channels = _channels(block.channels, config_dir, file)
    mcp_config_path, mcp_servers, selected = _mcp(raw.tools, config_dir, file)

    config = Config(
        config_dir=config_dir,
        config_path=config_path,
        enabled=enabled,
        host=host,
        port=port,
        state_dir=state_dir,
        limits=limits,
        retention=retention,
        named_routes=named_routes,
        detached_services=detached,
        continuation_servers=selected,
        mcp_servers=mcp_servers,
        mcp_config_path=mcp_config_path,
        synthesis=synthesis,
        channels=channels,
    )
    for name, route in named_routes.items():
        # capture never posts; notify_if_actionable does, so some channel must own the route.
        cid = route.conversation_id
        if route.mode == "notify_if_actionable" and cid is not None and config.channel_for(cid) is None:
            raise ConfigError(
                json_path(json_path("continuations.namedRoutes", name), "conversationId"),
                "no entry of continuations.channels delivers to this conversation (add it or '*')",
                file=file,
            )
    return config


def load_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None, check_secrets: bool = True
) -> Config:
    """Read and validate the JSON config at ``path``; relative paths resolve beside it.

    Raises:
        ConfigError: the file cannot be read or parsed (path ``$``), or a value is invalid.
    """
    file = os.path.abspath(os.fspath(path))
    document = _read_json(file, "$", "config file", file)
    return config_from_mapping(
        document, os.path.dirname(file), environ=environ, config_path=file, check_secrets=check_secrets
    )


def default_config(base_dir: str, *, environ: Mapping[str, str] | None = None) -> Config:
    """The documented defaults, used when no config file exists.

    The service is enabled (127.0.0.1:4319, state in ``.mono-agent/continuations`` and the
    outbox channel, both under ``base_dir``): with no file, the caller asked to run it.
    """
    return config_from_mapping({"continuations": {}}, base_dir, environ=environ)


# ---------------------------------------------------------------------------------------------
# Reading credentials when they are needed (never kept in the Config).


def detached_token(config: Config, service_name: str, environ: Mapping[str, str] | None = None) -> str:
    """The bearer of detached service ``service_name``, read from its environment variable.

    Raises:
        KeyError: no such detached service is configured.
        ConfigError: the variable is unset or too short (the message never shows the value).
    """
    service = config.detached_services[service_name]
    index = list(config.detached_services).index(service_name)
    path = json_path(json_path("continuations.detachedServices", index), "tokenEnv")
    return read_env_secret(
        service.token_env,
        path=path,
        environ=os.environ if environ is None else environ,
        min_chars=MIN_DETACHED_TOKEN_CHARS,
        file=config.config_path,
    )


def missing_detached_tokens(config: Config, environ: Mapping[str, str] | None = None) -> list[DetachedService]:
    """Detached services whose token variable is unset: their claims are refused until it is set."""
    env = os.environ if environ is None else environ
    return [s for s in config.detached_services.values() if not env.get(s.token_env)]


def synthesis_api_key(config: Config, environ: Mapping[str, str] | None = None) -> str | None:
    """The synthesis provider's API key, or ``None`` when no key is configured.

    Raises:
        ConfigError: ``apiKeyEnv`` is set but the variable is not.
    """
    env_name = config.synthesis.api_key_env
    if config.synthesis.provider == "template" or env_name is None:
        return None
    return read_env_secret(
        env_name,
        path="continuations.synthesis.apiKeyEnv",
        environ=os.environ if environ is None else environ,
        file=config.config_path,
    )

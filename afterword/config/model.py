"""The validated configuration: frozen Structs, the error type, and JSON-path helpers.

Everything here is already checked and normalized (absolute paths, defaults applied). Secrets
are never part of the model: a detached-service bearer, a Slack token or a synthesis API key
is referenced by the name of the environment variable that holds it, and read only when it is
needed (see :mod:`afterword.config.load`). Values that may carry credentials written into
configuration files (MCP ``env`` and ``headers``, webhook ``headers``) are masked in ``repr``
so a logged config never shows them.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import msgspec

from ..errors import CallerError

__all__ = [
    "ChannelConfig",
    "Config",
    "ConfigError",
    "DetachedService",
    "Limits",
    "McpServer",
    "NamedRoute",
    "OutboxChannelConfig",
    "Retention",
    "SlackChannelConfig",
    "SynthesisConfig",
    "WebhookChannelConfig",
    "channel_allows",
]


class ConfigError(CallerError):
    """The configuration is invalid: the operator's fault, never retried.

    ``path`` is the JSON path of the offending value (``continuations.port``,
    ``tools.continuationServers[0]``, ``$`` for the document itself); ``file`` names the file
    the path points into when one was read (the config file or the MCP config). The message
    is always ``"<path>: <problem>"`` and never contains a secret value.
    """

    def __init__(self, path: str, problem: str, *, file: str | None = None) -> None:
        self.path = path
        self.problem = problem
        self.file = file
        super().__init__(f"{path}: {problem}")


_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def json_path(parent: str, key: str | int) -> str:
    """Extend a JSON path: ``a.b`` for plain keys, ``a["odd key"]`` otherwise, ``a[3]`` for indexes."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if _PLAIN_KEY.match(key):
        return f"{parent}.{key}" if parent else key
    return f"{parent or '$'}[{json.dumps(key)}]"


_MSGSPEC_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>.*)`$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<key>.*)`$", re.DOTALL)


def from_validation_error(
    err: msgspec.ValidationError, prefix: str, *, file: str | None = None, type_: Any = None
) -> ConfigError:
    """Turn a msgspec validation error at ``prefix`` into a ConfigError with a full JSON path.

    msgspec reports ``"<message> - at `$.a.b[0]`"``; the path is rebased on ``prefix`` and
    unknown/missing-field messages point at the key itself rather than at its parent object.
    With ``type_`` (what was converted), an unknown key close to a known one gets a "did you
    mean" with that key.
    """
    m = _MSGSPEC_AT.match(str(err))
    assert m is not None  # the pattern matches any string
    msg = m["msg"]
    sub = m["path"] or ""
    path = prefix
    if sub:
        path = prefix + sub if prefix else sub.lstrip(".")
    if unknown := _UNKNOWN.match(msg):
        key = unknown["key"]
        close = difflib.get_close_matches(key, _keys_at(type_, sub), n=1) if type_ is not None else []
        problem = f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"
        return ConfigError(json_path(path, key), problem, file=file)
    if missing := _MISSING.match(msg):
        return ConfigError(json_path(path, missing["key"]), "required key is missing", file=file)
    problem = msg.replace("`", "")
    problem = problem[:1].lower() + problem[1:]
    return ConfigError(path or "$", problem, file=file)


_SEGMENT = re.compile(r"\.([^.\[]+)|\[[^\]]*\]")


def _keys_at(type_: Any, sub: str) -> list[str]:
    """The keys the object at msgspec path ``sub`` inside ``type_`` accepts ([] if unknown)."""
    from msgspec import inspect  # only on this error path

    def unwrap(info: Any) -> Any:
        if isinstance(info, inspect.UnionType):
            kinds = (inspect.StructType, inspect.DictType, inspect.ListType)
            return next((t for t in info.types if isinstance(t, kinds)), None)
        return info

    info = unwrap(inspect.type_info(type_))
    for segment in _SEGMENT.finditer(sub):
        name = segment.group(1)
        if name is not None and isinstance(info, inspect.StructType):
            field = next((f for f in info.fields if f.encode_name == name), None)
            info = unwrap(field.type) if field is not None else None
        elif name is None and isinstance(info, inspect.DictType):
            info = unwrap(info.value_type)
        elif name is None and isinstance(info, inspect.ListType):
            info = unwrap(info.item_type)
        else:
            return []
    if not isinstance(info, inspect.StructType):
        return []
    return [f.encode_name for f in info.fields]


def _masked(mapping: dict[str, str]) -> dict[str, str]:
    return {key: "***" for key in mapping}


def display_url(url: str) -> str:
    """``url`` without user info, query or fragment, which may carry credentials."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<malformed url>"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return f"{parts.scheme}://{netloc}{parts.path}"


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Admission, concurrency and timeout bounds (``continuations.limits``)."""

    max_active_records: int = 10_000
    max_active_per_origin: int = 500
    max_concurrent: int = 16
    synthesis_timeout_ms: int = 600_000
    delivery_timeout_ms: int = 120_000
    operator_page_size: int = 100
    # HTTP bounds against slow or numerous clients (docs/http-hardening.md).
    max_connections: int = 256
    body_timeout_ms: int = 10_000
    # A run bound over the host API is abandoned when its host stops calling for this long.
    run_lease_ms: int = 60_000
    # Runs begun over the host API and not yet settled (activated or abandoned), at once.
    max_open_runs: int = 1_000
    # MCP Tasks bridge: a task-backed continuation expires this long after adoption (or at
    # the task's ttlMs, if sooner); a host-followed one is dead-lettered when its host makes
    # no report for taskHostLeaseMs.
    task_deadline_ms: int = 24 * 3600 * 1000
    task_host_lease_ms: int = 60_000


class Retention(msgspec.Struct, frozen=True, kw_only=True):
    """How long terminal tombstones and captured answers are kept (``continuations.retention``)."""

    terminal_max_records: int = 50_000
    terminal_max_age_ms: int = 365 * 24 * 3600 * 1000
    captured_text_max_records: int = 1_000
    captured_text_max_age_ms: int = 30 * 24 * 3600 * 1000


NamedRouteMode = Literal["notify_if_actionable", "capture", "silent"]


class NamedRoute(msgspec.Struct, frozen=True, kw_only=True):
    """A host-owned policy a detached service may claim; it names its destination itself."""

    mode: NamedRouteMode
    conversation_id: str | None = None


class DetachedService(msgspec.Struct, frozen=True, kw_only=True):
    """A detached producer; its bearer lives in the environment variable ``token_env``."""

    name: str
    token_env: str


McpTransport = Literal["stdio", "http", "sse"]


class McpServer(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of the MCP config's ``mcpServers`` object.

    ``transport`` is ``stdio`` (``command``/``args``/``env``/``cwd``), ``http`` (streamable
    HTTP: ``url``/``headers``) or ``sse`` (legacy; never eligible for continuation authority).
    ``cwd`` is absolute: the configured one resolved against the MCP config's folder, or that
    folder itself; a path-like ``command`` is absolute too.
    """

    name: str
    transport: McpTransport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = {}

    def __repr__(self) -> str:
        if self.transport == "stdio":
            return (
                f"McpServer(name={self.name!r}, transport='stdio', command={self.command!r}, "
                f"args={self.args!r}, env={_masked(self.env)!r}, cwd={self.cwd!r})"
            )
        return (
            f"McpServer(name={self.name!r}, transport={self.transport!r}, "
            f"url={display_url(self.url or '')!r}, "
            f"headers={_masked(self.headers)!r})"
        )


class SynthesisConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``continuations.synthesis``: ``template`` (no model), an OpenAI-compatible endpoint, or
    Anthropic's Messages API.

    For ``openai`` and ``anthropic``, ``base_url`` and ``model`` are set; ``api_key_env`` names
    the environment variable holding the key (``None``: send no key, e.g. a local server).
    ``max_tokens`` bounds an ``anthropic`` answer (the Messages API requires it).
    """

    provider: Literal["template", "openai", "anthropic"] = "template"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    max_tokens: int = 1024


class OutboxChannelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Append each delivered chunk as one JSON line to ``path`` (absolute)."""

    adapter: ClassVar[str] = "outbox"
    path: str
    allow: tuple[str, ...] | None = None


class SlackChannelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``chat.postMessage`` into the thread; ``base_url`` is configurable for local fakes."""

    adapter: ClassVar[str] = "slack"
    base_url: str = "https://slack.com/api"
    token_env: str
    allow: tuple[str, ...] | None = None


class WebhookChannelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """POST one JSON body per chunk to ``url`` with an idempotency header."""

    adapter: ClassVar[str] = "webhook"
    url: str
    headers: dict[str, str] = {}
    allow: tuple[str, ...] | None = None

    def __repr__(self) -> str:
        return (
            f"WebhookChannelConfig(url={display_url(self.url)!r}, headers={_masked(self.headers)!r}, "
            f"allow={self.allow!r})"
        )


ChannelConfig = OutboxChannelConfig | SlackChannelConfig | WebhookChannelConfig


def channel_allows(channel: ChannelConfig, conversation_id: str) -> bool:
    """Whether the channel's ``allow`` list admits ``conversation_id``.

    No list admits everything. An entry admits the id equal to it and every id below it at a
    ``:`` boundary (``slack:C1`` admits ``slack:C1:T9`` but not ``slack:C10``); an entry that
    already ends in ``:`` is a pure prefix. An empty list admits nothing.
    """
    if channel.allow is None:
        return True
    for entry in channel.allow:
        if conversation_id == entry:
            return True
        prefix = entry if entry.endswith(":") else entry + ":"
        if conversation_id.startswith(prefix):
            return True
    return False


# The documented defaults (docs/configuration.md): a loopback port that survives restarts and a
# state directory under the config file's folder.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4319
DEFAULT_STATE_DIR = ".mono-agent/continuations"


class Config(msgspec.Struct, frozen=True, kw_only=True):
    """The whole validated configuration of one afterword installation."""

    config_dir: str
    config_path: str | None = None
    enabled: bool
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    state_dir: str
    limits: Limits = Limits()
    retention: Retention = Retention()
    named_routes: dict[str, NamedRoute] = {}
    detached_services: dict[str, DetachedService] = {}
    continuation_servers: tuple[str, ...] = ()
    mcp_servers: dict[str, McpServer] = {}
    mcp_config_path: str | None = None
    synthesis: SynthesisConfig = SynthesisConfig()
    channels: dict[str, ChannelConfig]

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the continuation HTTP surface (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def channel_for(self, conversation_id: str) -> tuple[str, ChannelConfig] | None:
        """The channel key and adapter that deliver to ``conversation_id``, if any.

        The key is the id's first ``:`` segment (``slack:C1:T1`` -> ``slack``); ``"*"`` is the
        fallback.
        """
        segment = conversation_id.split(":", 1)[0]
        if segment in self.channels:
            return segment, self.channels[segment]
        if "*" in self.channels:
            return "*", self.channels["*"]
        return None

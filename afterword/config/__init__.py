"""Configuration: the JSON file format of the continuation service, loaded and validated.

``load_config(path)`` reads a config file (and the MCP config it names) and returns a frozen
:class:`Config`; ``default_config(base_dir)`` gives the documented defaults when there is no
file. Invalid input raises :class:`ConfigError` whose message is ``"<json path>: <problem>"``.
Credentials are never part of a :class:`Config`; read them with :func:`detached_token` and
:func:`synthesis_api_key` when they are needed.
"""

from .load import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_STATE_DIR,
    MIN_DETACHED_TOKEN_CHARS,
    config_from_mapping,
    default_config,
    detached_token,
    load_config,
    missing_detached_tokens,
    read_env_secret,
    synthesis_api_key,
)
from .mcp import is_loopback_host, is_loopback_url, parse_mcp_servers, select_continuation_servers
from .model import (
    ChannelConfig,
    Config,
    ConfigError,
    DetachedService,
    Limits,
    McpServer,
    NamedRoute,
    OutboxChannelConfig,
    Retention,
    SlackChannelConfig,
    SynthesisConfig,
    WebhookChannelConfig,
    channel_allows,
)

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_STATE_DIR",
    "MIN_DETACHED_TOKEN_CHARS",
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
    "config_from_mapping",
    "default_config",
    "detached_token",
    "is_loopback_host",
    "is_loopback_url",
    "load_config",
    "missing_detached_tokens",
    "parse_mcp_servers",
    "read_env_secret",
    "select_continuation_servers",
    "synthesis_api_key",
]

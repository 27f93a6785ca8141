"""The ``continuations.channels`` block: which adapter delivers to which conversations."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import msgspec

from ..protocol.headers import sendable_header_name, sendable_header_value
from .checks import check_conversation_id, check_env_name, check_url, resolve_path
from .model import (
    ChannelConfig,
    ConfigError,
    OutboxChannelConfig,
    SlackChannelConfig,
    WebhookChannelConfig,
    json_path,
)
from .raw import RawChannel, RawOutbox, RawSlack, convert
from .secrets import read_env_secret

DEFAULT_OUTBOX = "outbox.jsonl"
_ADAPTERS = ("outbox", "slack", "webhook")
# Headers the webhook adapter writes itself or that frame the request: configured, they would
# be sent twice or contradict the body actually sent.
_OWN_HEADERS = frozenset(
    {"idempotency-key", "content-length", "transfer-encoding", "host", "connection", "accept-encoding"}
)


def _allow(raw: list[str] | None, path: str, file: str | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    for index, entry in enumerate(raw):
        check_conversation_id(entry, json_path(path, index), file)
    return tuple(raw)


def _headers(raw: dict[str, Any], path: str, file: str | None) -> dict[str, str]:
    """Webhook headers, each one an HTTP client can send: refused here rather than failing
    every post later. Errors name the header, never its value (it may be a credential)."""
    seen: set[str] = set()
    for key, value in raw.items():
        at = json_path(path, key)
        if not isinstance(value, str):
            raise ConfigError(at, f"expected str, got {type(value).__name__}", file=file)
        if not sendable_header_name(key):
            raise ConfigError(
                at, "header name must be an HTTP token (ASCII letters, digits, -, _ ...)", file=file
            )
        if key.lower() in _OWN_HEADERS:
            raise ConfigError(
                at, f"header {key} is set by afterword itself and cannot be configured", file=file
            )
        if key.lower() in seen:
            raise ConfigError(at, "header is configured twice (names are case-insensitive)", file=file)
        seen.add(key.lower())
        if not sendable_header_value(value):
            raise ConfigError(
                at,
                "header value must be printable ASCII (no newline or other control character, "
                "no leading or trailing space)",
                file=file,
            )
    return dict(raw)


def build_channels(
    raw: dict[str, Any] | msgspec.UnsetType,
    config_dir: str,
    file: str | None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, ChannelConfig]:
    """The channels block. With ``environ``, a Slack token variable that is set must hold a
    token that can be sent (printable ASCII, no space); an unset one fails each post instead,
    before anything is sent."""
    if isinstance(raw, msgspec.UnsetType):
        return {"*": OutboxChannelConfig(path=os.path.join(config_dir, DEFAULT_OUTBOX))}
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
        entry = convert(value, RawChannel, path, file)
        allow = _allow(entry.allow, json_path(path, "allow"), file)
        channel: ChannelConfig
        if isinstance(entry, RawOutbox):
            outbox = DEFAULT_OUTBOX if entry.path is None else entry.path
            channel = OutboxChannelConfig(
                path=resolve_path(config_dir, outbox, json_path(path, "path"), file), allow=allow
            )
        elif isinstance(entry, RawSlack):
            env_path = json_path(path, "tokenEnv")
            token_env = check_env_name(entry.token_env, env_path, file)
            if environ is not None and environ.get(token_env):
                read_env_secret(token_env, path=env_path, environ=environ, file=file)
            channel = SlackChannelConfig(
                base_url=check_url(entry.base_url, json_path(path, "baseUrl"), file).rstrip("/"),
                token_env=token_env,
                allow=allow,
            )
        else:
            channel = WebhookChannelConfig(
                url=check_url(entry.url, json_path(path, "url"), file),
                headers=_headers(entry.headers, json_path(path, "headers"), file),
                allow=allow,
            )
        channels[key] = channel
    return channels

"""The ``continuations.channels`` block: which adapter delivers to which conversations."""

from __future__ import annotations

import os
from typing import Any

import msgspec

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

DEFAULT_OUTBOX = "outbox.jsonl"
_ADAPTERS = ("outbox", "slack", "webhook")


def _allow(raw: list[str] | None, path: str, file: str | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    for index, entry in enumerate(raw):
        check_conversation_id(entry, json_path(path, index), file)
    return tuple(raw)


def _string_map(raw: dict[str, Any], path: str, file: str | None) -> dict[str, str]:
    for key, value in raw.items():
        if not isinstance(value, str):
            raise ConfigError(json_path(path, key), f"expected str, got {type(value).__name__}", file=file)
    return dict(raw)


def build_channels(
    raw: dict[str, Any] | msgspec.UnsetType, config_dir: str, file: str | None
) -> dict[str, ChannelConfig]:
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
            channel = SlackChannelConfig(
                base_url=check_url(entry.base_url, json_path(path, "baseUrl"), file).rstrip("/"),
                token_env=check_env_name(entry.token_env, json_path(path, "tokenEnv"), file),
                allow=allow,
            )
        else:
            channel = WebhookChannelConfig(
                url=check_url(entry.url, json_path(path, "url"), file),
                headers=_string_map(entry.headers, json_path(path, "headers"), file),
                allow=allow,
            )
        channels[key] = channel
    return channels

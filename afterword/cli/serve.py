"""``afterword serve``: the service in the foreground until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping
from urllib.parse import urlsplit

import anyio
import msgspec

from ..config import (
    Config,
    OutboxChannelConfig,
    SlackChannelConfig,
    WebhookChannelConfig,
    missing_detached_tokens,
)
from ..http.server import ServeError
from ..runtime import open_service
from ..worker.channels import OutboxChannel
from .statelog import StateChangeLog

_line = msgspec.json.Encoder()


class JsonLineFormatter(logging.Formatter):
    """Every log record as one JSON object on one line.

    Messages can carry text a client chose (a path, a header); JSON string escaping turns
    every newline and control character into an escape, so no request can start a log line
    of its own, such as a forged state-change event."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, object] = {
            "ts": round(record.created, 3),
            "event": "log",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return _line.encode(event).decode()


def log_handler() -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    return handler


def missing_credentials(config: Config, environ: Mapping[str, str]) -> list[str]:
    """What ``serve`` says at start about credential variables that are unset: each names
    the variable and what cannot happen without it (never a value)."""
    notes = [
        f"detached service {detached.name!r} cannot claim until {detached.token_env} holds its bearer "
        "(>= 16 printable characters) in this process's environment; "
        "see docs/configuration.md#detached-services"
        for detached in missing_detached_tokens(config, environ)
    ]
    notes += [
        f"slack channel {key!r} cannot post until {channel.token_env} holds its token; "
        "each post to it is dead-lettered (token_missing) without being sent"
        for key, channel in config.channels.items()
        if isinstance(channel, SlackChannelConfig) and not environ.get(channel.token_env)
    ]
    return notes


async def serve(config: Config, outbox: str | None = None) -> int:
    root = logging.getLogger("afterword")
    root.setLevel(logging.WARNING)
    changes = StateChangeLog()
    handler = log_handler()
    root.addHandler(handler)
    # Every log line, ours or another library's, first writes the state changes before it.
    flushed = [handler, *logging.getLogger().handlers]
    for h in flushed:
        h.addFilter(changes.filter)
    # Not also through the CLI's plain root handler, which would print the raw message.
    propagate, root.propagate = root.propagate, False
    try:
        return await _serve(config, outbox, changes)
    finally:
        changes.flush()  # stopped, failed or cancelled: no collected line is lost
        for h in flushed:
            h.removeFilter(changes.filter)
        root.removeHandler(handler)
        root.propagate = propagate


def _destination(channel: object, outbox: str | None) -> str:
    """Where a channel posts, without a secret: a webhook or Slack URL's path, query and user
    info can carry one (a Slack incoming-webhook path is its credential), so only the host
    and port are named; an outbox is a local file, named in full."""
    if isinstance(channel, OutboxChannelConfig):
        return f"outbox {outbox or channel.path}"
    if isinstance(channel, WebhookChannelConfig):
        adapter, url = "webhook", channel.url
    elif isinstance(channel, SlackChannelConfig):
        adapter, url = "slack", channel.base_url
    else:
        return type(channel).__name__
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        host, port = "?", ""
    return f"{adapter} {host}{port}"


def banner(config: Config, outbox: str | None = None) -> list[str]:
    """The start lines: address, state, and where answers go, so a wrong channel shows at
    start rather than at the first delivery. Names and hosts only, never a token or header."""
    lines = [f"afterword serving on {config.base_url} (state {config.state_dir})"]
    channels = ", ".join(f"{key} -> {_destination(c, outbox)}" for key, c in config.channels.items())
    lines.append(f"  channels: {channels}")
    if config.named_routes:
        lines.append(f"  named routes: {', '.join(config.named_routes)}")
    if config.detached_services:
        lines.append(f"  detached services: {', '.join(config.detached_services)}")
    return lines


def _say(changes: StateChangeLog, text: str) -> None:
    changes.flush()  # the state changes so far come first
    sys.stderr.write(text)


async def _serve(config: Config, outbox: str | None, changes: StateChangeLog) -> int:
    channels = None
    if outbox is not None:
        channels = {
            k: OutboxChannel(outbox) for k, c in config.channels.items() if isinstance(c, OutboxChannelConfig)
        }
    try:
        # The log is attached before recovery runs: its changes are state changes too.
        async with open_service(config, channels=channels or None, on_change=[changes]):
            _say(changes, "".join(line + "\n" for line in banner(config, outbox)))
            for note in missing_credentials(config, os.environ):
                sys.stderr.write(f"afterword: {note}\n")
            sys.stderr.flush()
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    _say(changes, f"afterword: {signal.Signals(signum).name}, shutting down\n")
                    break
    except ServeError as exc:
        _say(changes, f"afterword: {exc}\n")
        return 1
    _say(changes, "afterword: stopped\n")
    return 0

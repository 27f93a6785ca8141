"""``afterword serve``: the service in the foreground until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import signal
import sys
import time

import anyio
import msgspec

from ..app.runtime import open_service
from ..config import Config, OutboxChannelConfig, missing_detached_tokens
from ..continuations.model import Continuation
from ..http.server import ServeError
from ..worker.channels import OutboxChannel

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


def state_change_line(old: Continuation | None, new: Continuation) -> bytes:
    """One structured log line per state change: ids and states only (no token, payload or text)."""
    event = {
        "ts": round(time.time(), 3),
        "event": "continuation",
        "id": new.id,
        "from": old.state if old is not None else None,
        "to": new.state,
        "origin": new.origin_context,
        "mode": new.claim.mode,
        "server": new.claim.server_name,
        # Delivery attempts across operator retries, as status and `list` report them.
        "attempts": {
            "synthesis": new.attempts.synthesis,
            "delivery": new.delivery_attempts_before + new.attempts.delivery,
        },
        "error": new.last_error.code if new.last_error else None,
    }
    return _line.encode(event) + b"\n"


def log_change(old: Continuation | None, new: Continuation) -> None:
    if old is None or old.state != new.state or old.origin_context != new.origin_context:
        sys.stderr.buffer.write(state_change_line(old, new))
        sys.stderr.flush()


async def serve(config: Config, outbox: str | None = None) -> int:
    root = logging.getLogger("afterword")
    root.setLevel(logging.WARNING)
    handler = log_handler()
    root.addHandler(handler)
    # Not also through the CLI's plain root handler, which would print the raw message.
    propagate, root.propagate = root.propagate, False
    try:
        return await _serve(config, outbox)
    finally:
        root.removeHandler(handler)
        root.propagate = propagate


async def _serve(config: Config, outbox: str | None) -> int:
    channels = None
    if outbox is not None:
        channels = {
            k: OutboxChannel(outbox) for k, c in config.channels.items() if isinstance(c, OutboxChannelConfig)
        }
    try:
        # The log is attached before recovery runs: its changes are state changes too.
        async with open_service(config, channels=channels or None, on_change=[log_change]):
            sys.stderr.write(f"afterword serving on {config.base_url} (state {config.state_dir})\n")
            for detached in missing_detached_tokens(config):
                sys.stderr.write(
                    f"afterword: detached service {detached.name!r} cannot claim until {detached.token_env} "
                    "holds its bearer (>= 16 printable characters) in this process's environment; "
                    "see docs/configuration.md#detached-services\n"
                )
            sys.stderr.flush()
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    sys.stderr.write(f"afterword: {signal.Signals(signum).name}, shutting down\n")
                    break
    except ServeError as exc:
        sys.stderr.write(f"afterword: {exc}\n")
        return 1
    sys.stderr.write("afterword: stopped\n")
    return 0

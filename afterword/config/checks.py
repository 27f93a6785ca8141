"""Checks of single config values; each failure names the value's JSON path."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

import msgspec

from .model import ConfigError, json_path

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# Route and service names travel in JSON bodies and in the X-Mono-Agent-Service-Name header.
NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_CONVERSATION_ID = 1024


def resolve_path(base_dir: str, value: str, path: str, file: str | None) -> str:
    if not value:
        raise ConfigError(path, "must not be empty", file=file)
    if "\x00" in value:
        raise ConfigError(path, "must not contain NUL", file=file)
    # normpath, not realpath: a symlinked state directory must reach the disk layer's
    # fail-closed checks instead of being silently followed here.
    return os.path.normpath(os.path.join(base_dir, value))


def check_state_dir(state_dir: str, file: str | None) -> str:
    """Refuse a ``stateDir`` that can never be a directory: the nearest existing path on the
    way up (the directory itself or an ancestor) is a file. Anything finer (modes, owners,
    symlinks) is the disk layer's, when the service opens the directory."""
    probe = state_dir
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return state_dir
        probe = parent
    if not os.path.isdir(probe):
        where = "it is" if probe == state_dir else f"{probe} is"
        raise ConfigError(
            "continuations.stateDir",
            f"{state_dir} cannot be a directory: {where} a file (choose a directory path)",
            file=file,
        )
    return state_dir


def check_conversation_id(value: str, path: str, file: str | None) -> str:
    if not value:
        raise ConfigError(path, "conversation id must be a non-empty string", file=file)
    if len(value) > MAX_CONVERSATION_ID:
        raise ConfigError(path, f"conversation id is longer than {MAX_CONVERSATION_ID} characters", file=file)
    if _CONTROL.search(value):
        raise ConfigError(path, "conversation id must not contain control characters", file=file)
    return value


def check_url(value: str, path: str, file: str | None) -> str:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise ConfigError(path, "must be an absolute http(s) URL", file=file) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(path, "must be an absolute http(s) URL", file=file)
    return value


def check_env_name(value: str, path: str, file: str | None) -> str:
    if not _ENV_NAME.match(value):
        raise ConfigError(path, "must be an environment variable name (letters, digits, '_')", file=file)
    return value


def positive_ints(raw: msgspec.Struct, path: str, file: str | None) -> dict[str, int]:
    values: dict[str, int] = {}
    for field in msgspec.structs.fields(type(raw)):
        value = getattr(raw, field.name)
        if value < 1:
            raise ConfigError(
                json_path(path, field.encode_name), f"must be a positive integer, got {value}", file=file
            )
        values[field.name] = value
    return values


def check_host(value: str, file: str | None) -> str:
    host = value.lower()
    if host not in LOOPBACK_HOSTS:
        raise ConfigError(
            "continuations.host",
            f"{value!r} is not a loopback address; use localhost, 127.0.0.1 or ::1",
            file=file,
        )
    return host


def check_port(value: int, file: str | None) -> int:
    if value == 0:
        raise ConfigError(
            "continuations.port",
            "ephemeral port 0 is rejected; result/status URLs and operator access must survive restarts",
            file=file,
        )
    if not 1 <= value <= 65535:
        raise ConfigError("continuations.port", f"must be from 1 through 65535, got {value}", file=file)
    return value

"""Reading a JSON config file: size-capped, UTF-8, repeated keys refused.

Every failure is a :class:`~afterword.config.model.ConfigError` at the JSON path the caller
names, so a bad MCP config reads as a problem with ``tools.mcpConfigPath``.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import CallerError
from .model import ConfigError

__all__ = ["MAX_CONFIG_BYTES", "DuplicateKeyError", "read_json", "unique_object_pairs"]

# Config files are small; the cap only stops a mistyped path (a device, a huge log) from
# being read whole. The MCP config may be another client's whole settings file.
MAX_CONFIG_BYTES = 16 * 1024 * 1024


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


def read_json(file: str, error_path: str, what: str, error_file: str | None) -> Any:
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

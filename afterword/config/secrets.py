"""Reading credentials from the environment when they are needed; a Config never holds one.

Errors name the variable, never its value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .model import Config, ConfigError, DetachedService, json_path

__all__ = [
    "MIN_DETACHED_TOKEN_CHARS",
    "detached_token",
    "missing_detached_tokens",
    "read_env_secret",
    "synthesis_api_key",
]

MIN_DETACHED_TOKEN_CHARS = 16


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
    # ASCII, no control character or DEL, no space: exactly the characters 33-126, checked in C
    # (a detached claim reads its bearer twice per request).
    if not (value.isascii() and value.isprintable() and " " not in value):
        raise ConfigError(
            path, f"environment variable {env_name} must hold printable ASCII without spaces", file=file
        )
    return value


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


def missing_detached_tokens(
    config: Config, environ: Mapping[str, str] | None = None
) -> list[DetachedService]:
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

"""Loading and validating the configuration file (docs/design.md, Contracts: configuration).

Two phases. First the document's *shape* is checked by converting it into the input Structs of
``raw.py``, which forbid unknown keys (msgspec reports the JSON path). Then the *rules* of the
spec are checked one value at a time (``checks.py`` for single values, ``sections.py`` and
``channels.py`` per block) and the frozen :class:`~afterword.config.model.Config` is built.
Every failure is a :class:`ConfigError` naming the JSON path of the first problem.

The only effects are reading the config file and the MCP config it names (``jsonfile.py``),
and reading (never storing) the detached-service tokens from the environment to check that
they exist (``secrets.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import msgspec

from .channels import build_channels
from .checks import check_host, check_port, check_state_dir, positive_ints, resolve_path
from .jsonfile import DuplicateKeyError, read_json, unique_object_pairs
from .model import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_STATE_DIR,
    Config,
    ConfigError,
    Limits,
    Retention,
    json_path,
)
from .raw import RawConfig, RawContinuations, convert
from .secrets import (
    MIN_DETACHED_TOKEN_CHARS,
    detached_token,
    missing_detached_tokens,
    read_env_secret,
    synthesis_api_key,
)
from .sections import build_detached_services, build_mcp, build_named_routes, build_synthesis

MAX_RUN_LEASE_MS = 60 * 60 * 1000
MAX_TASK_DEADLINE_MS = 30 * 24 * 3600 * 1000  # the longest deadline any continuation may have

# The names below were all defined here before the loader was split; they stay importable.
__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_STATE_DIR",
    "MIN_DETACHED_TOKEN_CHARS",
    "DuplicateKeyError",
    "config_from_mapping",
    "default_config",
    "detached_token",
    "load_config",
    "missing_detached_tokens",
    "read_env_secret",
    "synthesis_api_key",
    "unique_object_pairs",
]


def check_task_limits(limits: Limits, file: str | None) -> None:
    """The Tasks bridge's bounds: a task outlives no claim (30 days), and a host lease is
    at most an hour, like a run's."""
    if limits.task_deadline_ms > MAX_TASK_DEADLINE_MS:
        raise ConfigError(
            "continuations.limits.taskDeadlineMs",
            f"must be at most {MAX_TASK_DEADLINE_MS} (30 days)",
            file=file,
        )
    if limits.task_host_lease_ms > MAX_RUN_LEASE_MS:
        raise ConfigError(
            "continuations.limits.taskHostLeaseMs",
            f"must be at most {MAX_RUN_LEASE_MS} (one hour)",
            file=file,
        )


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
    raw: RawConfig = convert(dict(data), RawConfig, "", file)
    present = not isinstance(raw.continuations, msgspec.UnsetType)
    block = raw.continuations if not isinstance(raw.continuations, msgspec.UnsetType) else RawContinuations()
    # The service runs when its block is present or a server is selected, unless switched off.
    enabled = (present or bool(raw.tools.continuation_servers)) and block.enabled

    host = check_host(block.host, file)
    port = check_port(block.port, file)
    state_dir = check_state_dir(
        resolve_path(config_dir, block.state_dir, "continuations.stateDir", file), file
    )
    limits = Limits(**positive_ints(block.limits, "continuations.limits", file))
    if limits.run_lease_ms > MAX_RUN_LEASE_MS:
        # A run's claim capability lasts an hour; a longer lease would outlive it.
        raise ConfigError(
            "continuations.limits.runLeaseMs", f"must be at most {MAX_RUN_LEASE_MS} (one hour)", file=file
        )
    check_task_limits(limits, file)
    retention = Retention(**positive_ints(block.retention, "continuations.retention", file))
    named_routes = build_named_routes(block.named_routes, file)
    # A disabled service never authenticates detached callers, so their tokens need not be set.
    detached = build_detached_services(block.detached_services, env, enabled and check_secrets, file)
    synthesis = build_synthesis(block.synthesis, file)
    channels = build_channels(block.channels, config_dir, file, env if enabled and check_secrets else None)
    mcp_config_path, mcp_servers, selected = build_mcp(raw.tools, config_dir, file)

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
    document = read_json(file, "$", "config file", file)
    return config_from_mapping(
        document, os.path.dirname(file), environ=environ, config_path=file, check_secrets=check_secrets
    )


def default_config(base_dir: str, *, environ: Mapping[str, str] | None = None) -> Config:
    """The documented defaults, used when no config file exists.

    The service is enabled (127.0.0.1:4319, state in ``.mono-agent/continuations`` and the
    outbox channel, both under ``base_dir``): with no file, the caller asked to run it.
    """
    return config_from_mapping({"continuations": {}}, base_dir, environ=environ)

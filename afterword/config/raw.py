"""The config file's input shape: camelCase, unknown keys rejected (docs/design.md, Contracts: configuration).

Maps keyed by user-chosen names are typed ``dict[str, Any]`` and converted entry by entry by
the section checks, because msgspec reports a dict value's path as ``[...]`` and would lose the
name the operator needs to see.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .model import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_STATE_DIR, Limits, Retention, from_validation_error

DEFAULT_SLACK_BASE_URL = "https://slack.com/api"

_LIMIT_DEFAULTS = Limits()
_RETENTION_DEFAULTS = Retention()


class RawTools(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    mcp_config_path: str | None = None
    continuation_servers: list[str] = []
    # The host's request-context selection is a separate feature: accepted, and deliberately
    # never consulted for continuation authority.
    mcp_request_context_servers: list[str] = []


class RawLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    max_active_records: int = _LIMIT_DEFAULTS.max_active_records
    max_active_per_origin: int = _LIMIT_DEFAULTS.max_active_per_origin
    max_concurrent: int = _LIMIT_DEFAULTS.max_concurrent
    synthesis_timeout_ms: int = _LIMIT_DEFAULTS.synthesis_timeout_ms
    delivery_timeout_ms: int = _LIMIT_DEFAULTS.delivery_timeout_ms
    operator_page_size: int = _LIMIT_DEFAULTS.operator_page_size
    max_connections: int = _LIMIT_DEFAULTS.max_connections
    body_timeout_ms: int = _LIMIT_DEFAULTS.body_timeout_ms
    run_lease_ms: int = _LIMIT_DEFAULTS.run_lease_ms
    max_open_runs: int = _LIMIT_DEFAULTS.max_open_runs
    task_deadline_ms: int = _LIMIT_DEFAULTS.task_deadline_ms
    task_host_lease_ms: int = _LIMIT_DEFAULTS.task_host_lease_ms


class RawRetention(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    terminal_max_records: int = _RETENTION_DEFAULTS.terminal_max_records
    terminal_max_age_ms: int = _RETENTION_DEFAULTS.terminal_max_age_ms
    captured_text_max_records: int = _RETENTION_DEFAULTS.captured_text_max_records
    captured_text_max_age_ms: int = _RETENTION_DEFAULTS.captured_text_max_age_ms


class RawNamedRoute(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    mode: str
    conversation_id: str | None = None


class RawDetachedService(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True
):
    name: str
    token_env: str


class RawSynthesis(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    provider: str = "template"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    max_tokens: int | None = None


class RawOutbox(
    msgspec.Struct,
    tag="outbox",
    tag_field="adapter",
    frozen=True,
    forbid_unknown_fields=True,
    rename="camel",
    kw_only=True,
):
    path: str | None = None
    allow: list[str] | None = None


class RawSlack(
    msgspec.Struct,
    tag="slack",
    tag_field="adapter",
    frozen=True,
    forbid_unknown_fields=True,
    rename="camel",
    kw_only=True,
):
    token_env: str
    base_url: str = DEFAULT_SLACK_BASE_URL
    allow: list[str] | None = None


class RawWebhook(
    msgspec.Struct,
    tag="webhook",
    tag_field="adapter",
    frozen=True,
    forbid_unknown_fields=True,
    rename="camel",
    kw_only=True,
):
    url: str
    headers: dict[str, Any] = {}
    allow: list[str] | None = None


RawChannel = RawOutbox | RawSlack | RawWebhook


class RawContinuations(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    enabled: bool = True
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    state_dir: str = DEFAULT_STATE_DIR
    limits: RawLimits = RawLimits()
    retention: RawRetention = RawRetention()
    named_routes: dict[str, Any] = {}
    detached_services: list[RawDetachedService] = []
    synthesis: RawSynthesis = RawSynthesis()
    channels: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class RawConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel", kw_only=True):
    tools: RawTools = RawTools()
    # UNSET (absent) and an object differ: a present block starts the service.
    continuations: RawContinuations | msgspec.UnsetType = msgspec.UNSET


def convert(value: Any, type_: Any, path: str, file: str | None) -> Any:
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as err:
        raise from_validation_error(err, path, file=file, type_=type_) from None

"""Configuration loading and validation (docs/design.md, Contracts: configuration; spec "Configure a trusted
continuation server"). Invalid documents are table-driven: each row names the exact JSON path
the error must carry."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afterword.config import (
    Config,
    ConfigError,
    OutboxChannelConfig,
    SlackChannelConfig,
    WebhookChannelConfig,
    channel_allows,
    config_from_mapping,
    default_config,
    detached_token,
    is_loopback_host,
    is_loopback_url,
    load_config,
    missing_detached_tokens,
    read_env_secret,
    synthesis_api_key,
)

TOKEN = "tok-A1b2C3d4E5f6G7h8"  # 19 characters
TOKEN_2 = "tok-Z9y8X7w6V5u4T3s2"
ENV = {"WORK_CONTROL_CONTINUATION_TOKEN": TOKEN}

MCP: dict[str, Any] = {
    "otherClientSetting": {"kept": "untouched"},
    "mcpServers": {
        "work-control": {
            "command": "python",
            "args": ["-m", "work_control"],
            "env": {"API_KEY": "mcp-env-secret-value"},
            "cwd": "tools",
        },
        "typed-stdio": {"type": "stdio", "command": "node", "args": ["srv.js"]},
        "local-http": {
            "url": "http://127.0.0.1:9000/mcp",
            "headers": {"Authorization": "Bearer mcp-hdr-secret"},
        },
        "local-typed": {"type": "streamable-http", "url": "http://localhost:9001/mcp"},
        "local-v6": {"type": "http", "url": "http://[::1]:9002/mcp"},
        "remote-http": {"url": "https://tools.example.com/mcp"},
        "local-sse": {"type": "sse", "url": "http://127.0.0.1:9003/sse"},
    },
}

SPEC_EXAMPLE: dict[str, Any] = {
    "tools": {"mcpConfigPath": "./mcp.json", "continuationServers": ["work-control"]},
    "continuations": {
        "enabled": True,
        "host": "127.0.0.1",
        "port": 4319,
        "stateDir": ".mono-agent/continuations",
        "limits": {
            "maxActiveRecords": 10000,
            "maxActivePerOrigin": 500,
            "maxConcurrent": 16,
            "synthesisTimeoutMs": 600000,
            "deliveryTimeoutMs": 120000,
            "operatorPageSize": 100,
        },
        "retention": {
            "terminalMaxRecords": 50000,
            "terminalMaxAgeMs": 31536000000,
            "capturedTextMaxRecords": 1000,
            "capturedTextMaxAgeMs": 2592000000,
        },
        "namedRoutes": {
            "daily-attention": {
                "mode": "notify_if_actionable",
                "conversationId": "slack:C_EXAMPLE:T_EXAMPLE",
            },
            "verification": {"mode": "capture", "conversationId": "slack:C_EXAMPLE:T_EXAMPLE"},
            "background-index": {"mode": "silent"},
        },
        "detachedServices": [{"name": "work-control", "tokenEnv": "WORK_CONTROL_CONTINUATION_TOKEN"}],
    },
}


@pytest.fixture
def cfg_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "mcp.json").write_text(json.dumps(MCP))
    return folder


def write(folder: Path, doc: Any, name: str = "afterword.json") -> Path:
    path = folder / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def load(folder: Path, doc: Any, env: dict[str, str] | None = None) -> Config:
    return load_config(write(folder, doc), environ=ENV if env is None else env)


def with_(doc: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with the dotted key set (``value is DELETE`` removes it)."""
    out = copy.deepcopy(doc)
    node = out
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[int(key)]
    if isinstance(node, list):
        node[int(last)] = value
    elif value is DELETE:
        del node[last]
    else:
        node[last] = value
    return out


DELETE = object()


# ---------------------------------------------------------------------------------------------
# Valid documents and defaults.


def test_spec_example_loads_with_every_value(cfg_dir: Path) -> None:
    config = load(cfg_dir, SPEC_EXAMPLE)
    assert config.enabled is True
    assert (config.host, config.port) == ("127.0.0.1", 4319)
    assert config.base_url == "http://127.0.0.1:4319"
    assert config.state_dir == str(cfg_dir / ".mono-agent" / "continuations")
    assert config.config_dir == str(cfg_dir)
    assert config.config_path == str(cfg_dir / "afterword.json")
    assert config.limits.max_active_records == 10000
    assert config.limits.max_active_per_origin == 500
    assert config.limits.max_concurrent == 16
    assert config.limits.synthesis_timeout_ms == 600000
    assert config.limits.delivery_timeout_ms == 120000
    assert config.limits.operator_page_size == 100
    assert config.retention.terminal_max_records == 50000
    assert config.retention.terminal_max_age_ms == 365 * 86400 * 1000
    assert config.retention.captured_text_max_records == 1000
    assert config.retention.captured_text_max_age_ms == 30 * 86400 * 1000
    routes = config.named_routes
    assert routes["daily-attention"].mode == "notify_if_actionable"
    assert routes["daily-attention"].conversation_id == "slack:C_EXAMPLE:T_EXAMPLE"
    assert routes["verification"].mode == "capture"
    assert routes["background-index"].mode == "silent"
    assert routes["background-index"].conversation_id is None
    assert config.detached_services["work-control"].token_env == "WORK_CONTROL_CONTINUATION_TOKEN"
    assert config.continuation_servers == ("work-control",)
    assert config.mcp_config_path == str(cfg_dir / "mcp.json")
    assert config.synthesis.provider == "template"
    assert config.channels == {"*": OutboxChannelConfig(path=str(cfg_dir / "outbox.jsonl"))}


def test_omitted_values_take_the_documented_defaults(cfg_dir: Path) -> None:
    explicit = load(cfg_dir, SPEC_EXAMPLE)
    minimal = load(cfg_dir, {"continuations": {}})
    assert minimal.limits == explicit.limits
    assert minimal.retention == explicit.retention
    assert (minimal.host, minimal.port, minimal.state_dir) == (
        explicit.host,
        explicit.port,
        explicit.state_dir,
    )


def test_only_continuation_servers_starts_the_service_with_defaults(cfg_dir: Path) -> None:
    config = load(cfg_dir, {"tools": {"mcpConfigPath": "mcp.json", "continuationServers": ["work-control"]}})
    assert config.enabled is True
    assert config.base_url == "http://127.0.0.1:4319"
    assert config.state_dir == str(cfg_dir / ".mono-agent/continuations")
    assert config == config_from_mapping(
        {
            "tools": {"mcpConfigPath": "mcp.json", "continuationServers": ["work-control"]},
            "continuations": {},
        },
        str(cfg_dir),
        environ=ENV,
        config_path=str(cfg_dir / "afterword.json"),
    )


@pytest.mark.parametrize(
    ("doc", "enabled"),
    [
        ({}, False),
        ({"tools": {"mcpConfigPath": "mcp.json"}}, False),
        ({"tools": {"mcpConfigPath": "mcp.json", "continuationServers": []}}, False),
        ({"continuations": {}}, True),
        ({"tools": {"mcpConfigPath": "mcp.json", "continuationServers": ["local-http"]}}, True),
        ({"continuations": {"enabled": False}}, False),
        (
            {
                "tools": {"mcpConfigPath": "mcp.json", "continuationServers": ["work-control"]},
                "continuations": {"enabled": False},
            },
            False,
        ),
    ],
)
def test_when_the_service_starts(cfg_dir: Path, doc: dict[str, Any], enabled: bool) -> None:
    assert load(cfg_dir, doc).enabled is enabled


def test_default_config_is_the_documented_defaults(tmp_path: Path) -> None:
    config = default_config(str(tmp_path), environ={})
    assert config.enabled is True
    assert config.base_url == "http://127.0.0.1:4319"
    assert config.state_dir == str(tmp_path / ".mono-agent" / "continuations")
    assert config.channels == {"*": OutboxChannelConfig(path=str(tmp_path / "outbox.jsonl"))}
    assert config.named_routes == {} and config.detached_services == {} and config.mcp_servers == {}


def test_relative_paths_resolve_against_the_config_folder_not_the_cwd(
    cfg_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    doc = {
        "tools": {"mcpConfigPath": "mcp.json"},
        "continuations": {
            "stateDir": "state/../st",
            "channels": {"*": {"adapter": "outbox", "path": "out/o.jsonl"}},
        },
    }
    config = load_config(os.path.relpath(write(cfg_dir, doc), elsewhere), environ={})
    assert config.mcp_config_path == str(cfg_dir / "mcp.json")
    assert config.state_dir == str(cfg_dir / "st")
    assert config.channels["*"] == OutboxChannelConfig(path=str(cfg_dir / "out" / "o.jsonl"))
    assert config.mcp_servers["work-control"].cwd == str(cfg_dir / "tools")
    absolute = load(cfg_dir, {"continuations": {"stateDir": str(tmp_path / "abs")}})
    assert absolute.state_dir == str(tmp_path / "abs")


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:4400"),
        ("localhost", "http://localhost:4400"),
        ("::1", "http://[::1]:4400"),
    ],
)
def test_loopback_hosts_accepted_and_base_url_brackets_ipv6(cfg_dir: Path, host: str, url: str) -> None:
    config = load(cfg_dir, {"continuations": {"host": host, "port": 4400}})
    assert config.base_url == url


def test_config_is_frozen(cfg_dir: Path) -> None:
    config = load(cfg_dir, SPEC_EXAMPLE)
    with pytest.raises(AttributeError):
        config.port = 1  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# Invalid documents: the exact JSON path of each rule.

SERVERS = {"tools": {"mcpConfigPath": "mcp.json", "continuationServers": ["work-control"]}}

INVALID: list[tuple[str, dict[str, Any], str, str]] = [
    # (case id, document, expected path, expected fragment of the problem)
    ("unknown top-level key", {"tool": {}}, "tool", "unknown key"),
    (
        "unknown continuations key",
        {"continuations": {"stateDirectory": "x"}},
        "continuations.stateDirectory",
        "unknown",
    ),
    ("unknown tools key", {"tools": {"mcpConfig": "x"}}, "tools.mcpConfig", "unknown key"),
    (
        "unknown limits key",
        {"continuations": {"limits": {"maxActive": 3}}},
        "continuations.limits.maxActive",
        "unknown",
    ),
    (
        "unknown named-route key",
        {"continuations": {"namedRoutes": {"r": {"mode": "silent", "channel": "x"}}}},
        "continuations.namedRoutes.r.channel",
        "unknown key",
    ),
    ("continuations null", {"continuations": None}, "continuations", "expected object, got null"),
    ("tools not object", {"tools": 5}, "tools", "expected object, got int"),
    # host: loopback only
    ("remote host", {"continuations": {"host": "0.0.0.0"}}, "continuations.host", "not a loopback"),
    ("public host", {"continuations": {"host": "example.com"}}, "continuations.host", "not a loopback"),
    ("other loopback ip", {"continuations": {"host": "127.0.0.2"}}, "continuations.host", "not a loopback"),
    ("bracketed v6", {"continuations": {"host": "[::1]"}}, "continuations.host", "not a loopback"),
    ("host not string", {"continuations": {"host": 127}}, "continuations.host", "expected str"),
    # port
    ("port 0", {"continuations": {"port": 0}}, "continuations.port", "ephemeral port 0 is rejected"),
    ("port too high", {"continuations": {"port": 65536}}, "continuations.port", "1 through 65535"),
    ("port negative", {"continuations": {"port": -1}}, "continuations.port", "1 through 65535"),
    ("port string", {"continuations": {"port": "4319"}}, "continuations.port", "expected int, got str"),
    ("port float", {"continuations": {"port": 4319.0}}, "continuations.port", "expected int, got float"),
    ("port bool", {"continuations": {"port": True}}, "continuations.port", "expected int, got bool"),
    ("enabled not bool", {"continuations": {"enabled": "no"}}, "continuations.enabled", "expected bool"),
    ("empty stateDir", {"continuations": {"stateDir": ""}}, "continuations.stateDir", "must not be empty"),
    # continuation servers
    (
        "servers without mcpConfigPath",
        {"tools": {"continuationServers": ["x"]}},
        "tools.mcpConfigPath",
        "required",
    ),
    (
        "mcp config missing",
        {"tools": {"mcpConfigPath": "nope.json", "continuationServers": ["x"]}},
        "tools.mcpConfigPath",
        "cannot read MCP config",
    ),
    (
        "unlisted server",
        {"tools": {"mcpConfigPath": "mcp.json", "continuationServers": ["work-control", "ghost"]}},
        "tools.continuationServers[1]",
        "'ghost' is not defined in",
    ),
    (
        "remote http server",
        {"tools": {"mcpConfigPath": "mcp.json", "continuationServers": ["remote-http"]}},
        "tools.continuationServers[0]",
        "remote HTTP",
    ),
    (
        "sse server",
        {"tools": {"mcpConfigPath": "mcp.json", "continuationServers": ["local-http", "local-sse"]}},
        "tools.continuationServers[1]",
        "uses SSE",
    ),
    (
        "server listed twice",
        {"tools": {"mcpConfigPath": "mcp.json", "continuationServers": ["work-control", "work-control"]}},
        "tools.continuationServers[1]",
        "already listed at [0]",
    ),
    (
        "server name not string",
        {"tools": {"mcpConfigPath": "mcp.json", "continuationServers": [3]}},
        "tools.continuationServers[0]",
        "expected str",
    ),
    # named routes
    (
        "reply is not a named-route mode",
        {"continuations": {"namedRoutes": {"r": {"mode": "reply", "conversationId": "slack:C1"}}}},
        "continuations.namedRoutes.r.mode",
        "'reply' is not a named-route mode",
    ),
    (
        "unknown mode",
        {"continuations": {"namedRoutes": {"r": {"mode": "shout", "conversationId": "slack:C1"}}}},
        "continuations.namedRoutes.r.mode",
        "unknown mode 'shout'",
    ),
    (
        "missing mode",
        {"continuations": {"namedRoutes": {"r": {"conversationId": "slack:C1"}}}},
        "continuations.namedRoutes.r.mode",
        "required key is missing",
    ),
    (
        "notify needs conversationId",
        {"continuations": {"namedRoutes": {"daily": {"mode": "notify_if_actionable"}}}},
        "continuations.namedRoutes.daily.conversationId",
        "required for mode 'notify_if_actionable'",
    ),
    (
        "capture needs conversationId",
        {"continuations": {"namedRoutes": {"v": {"mode": "capture"}}}},
        "continuations.namedRoutes.v.conversationId",
        "required for mode 'capture'",
    ),
    (
        "silent forbids conversationId",
        {"continuations": {"namedRoutes": {"bg": {"mode": "silent", "conversationId": "slack:C1"}}}},
        "continuations.namedRoutes.bg.conversationId",
        "forbidden for mode 'silent'",
    ),
    (
        "empty conversationId",
        {"continuations": {"namedRoutes": {"v": {"mode": "capture", "conversationId": ""}}}},
        "continuations.namedRoutes.v.conversationId",
        "non-empty",
    ),
    (
        "conversationId not string",
        {"continuations": {"namedRoutes": {"v": {"mode": "capture", "conversationId": 42}}}},
        "continuations.namedRoutes.v.conversationId",
        "expected str",
    ),
    (
        "route name with a space",
        {"continuations": {"namedRoutes": {"bad name": {"mode": "silent"}}}},
        'continuations.namedRoutes["bad name"]',
        "route name",
    ),
    (
        "route not object",
        {"continuations": {"namedRoutes": {"r": "silent"}}},
        "continuations.namedRoutes.r",
        "expected object, got str",
    ),
    (
        "notify route no channel delivers",
        {
            "continuations": {
                "namedRoutes": {"d": {"mode": "notify_if_actionable", "conversationId": "teams:X"}},
                "channels": {"slack": {"adapter": "slack", "tokenEnv": "SLACK_TOKEN"}},
            }
        },
        "continuations.namedRoutes.d.conversationId",
        "no entry of continuations.channels",
    ),
    # detached services
    (
        "detached duplicate name",
        {
            "continuations": {
                "detachedServices": [
                    {"name": "w", "tokenEnv": "WORK_CONTROL_CONTINUATION_TOKEN"},
                    {"name": "w", "tokenEnv": "OTHER_TOKEN"},
                ]
            }
        },
        "continuations.detachedServices[1].name",
        "duplicate service name 'w'",
    ),
    (
        "detached missing tokenEnv",
        {"continuations": {"detachedServices": [{"name": "w"}]}},
        "continuations.detachedServices[0].tokenEnv",
        "required key is missing",
    ),
    (
        "detached tokenEnv not a name",
        {"continuations": {"detachedServices": [{"name": "w", "tokenEnv": "has space"}]}},
        "continuations.detachedServices[0].tokenEnv",
        "environment variable name",
    ),
    (
        "detached shared tokenEnv",
        {
            "continuations": {
                "detachedServices": [
                    {"name": "a", "tokenEnv": "WORK_CONTROL_CONTINUATION_TOKEN"},
                    {"name": "b", "tokenEnv": "WORK_CONTROL_CONTINUATION_TOKEN"},
                ]
            }
        },
        "continuations.detachedServices[1].tokenEnv",
        "shared with detachedServices[0]",
    ),
    (
        "detached unknown key",
        {"continuations": {"detachedServices": [{"name": "w", "tokenEnv": "X", "token": "inline"}]}},
        "continuations.detachedServices[0].token",
        "unknown key",
    ),
    (
        "detached name with a colon",
        {"continuations": {"detachedServices": [{"name": "a:b", "tokenEnv": "X"}]}},
        "continuations.detachedServices[0].name",
        "service name",
    ),
    # synthesis
    (
        "unknown provider",
        {"continuations": {"synthesis": {"provider": "magic"}}},
        "continuations.synthesis.provider",
        "unknown provider 'magic'",
    ),
    (
        "openai without model",
        {"continuations": {"synthesis": {"provider": "openai"}}},
        "continuations.synthesis.model",
        "required for provider 'openai'",
    ),
    (
        "template with model",
        {"continuations": {"synthesis": {"model": "gpt"}}},
        "continuations.synthesis.model",
        "only valid with provider 'openai'",
    ),
    (
        "openai bad baseUrl",
        {"continuations": {"synthesis": {"provider": "openai", "model": "m", "baseUrl": "ftp://x"}}},
        "continuations.synthesis.baseUrl",
        "http(s) URL",
    ),
    # channels
    ("empty channels", {"continuations": {"channels": {}}}, "continuations.channels", "at least one channel"),
    (
        "channel key with colon",
        {"continuations": {"channels": {"slack:C1": {"adapter": "outbox"}}}},
        'continuations.channels["slack:C1"]',
        "first segment",
    ),
    (
        "unknown adapter",
        {"continuations": {"channels": {"*": {"adapter": "carrier-pigeon"}}}},
        'continuations.channels["*"].adapter',
        "unknown adapter 'carrier-pigeon'",
    ),
    (
        "missing adapter",
        {"continuations": {"channels": {"*": {"path": "o.jsonl"}}}},
        'continuations.channels["*"].adapter',
        "required key is missing",
    ),
    (
        "slack without tokenEnv",
        {"continuations": {"channels": {"slack": {"adapter": "slack"}}}},
        "continuations.channels.slack.tokenEnv",
        "required key is missing",
    ),
    (
        "slack bad baseUrl",
        {
            "continuations": {
                "channels": {"slack": {"adapter": "slack", "tokenEnv": "T", "baseUrl": "slack.com"}}
            }
        },
        "continuations.channels.slack.baseUrl",
        "http(s) URL",
    ),
    (
        "webhook without url",
        {"continuations": {"channels": {"hook": {"adapter": "webhook"}}}},
        "continuations.channels.hook.url",
        "required key is missing",
    ),
    (
        "webhook header not string",
        {
            "continuations": {
                "channels": {"hook": {"adapter": "webhook", "url": "http://h/x", "headers": {"X-N": 1}}}
            }
        },
        "continuations.channels.hook.headers.X-N",
        "expected str, got int",
    ),
    (
        "outbox unknown key",
        {"continuations": {"channels": {"*": {"adapter": "outbox", "file": "o.jsonl"}}}},
        'continuations.channels["*"].file',
        "unknown key",
    ),
    (
        "empty allow entry",
        {"continuations": {"channels": {"*": {"adapter": "outbox", "allow": ["slack:C1", ""]}}}},
        'continuations.channels["*"].allow[1]',
        "non-empty",
    ),
]


@pytest.mark.parametrize(
    ("doc", "path", "fragment"), [row[1:] for row in INVALID], ids=[row[0] for row in INVALID]
)
def test_invalid_documents_name_the_json_path(
    cfg_dir: Path, doc: dict[str, Any], path: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(cfg_dir, doc)
    err = caught.value
    assert err.path == path
    assert fragment in err.problem
    assert str(err) == f"{path}: {err.problem}"


def test_port_zero_message_matches_the_contract(cfg_dir: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load(cfg_dir, {"continuations": {"port": 0}})
    assert str(caught.value).startswith("continuations.port: ephemeral port 0 is rejected")


LIMIT_FIELDS = [
    ("limits", key)
    for key in (
        "maxActiveRecords",
        "maxActivePerOrigin",
        "maxConcurrent",
        "synthesisTimeoutMs",
        "deliveryTimeoutMs",
        "operatorPageSize",
    )
] + [
    ("retention", key)
    for key in ("terminalMaxRecords", "terminalMaxAgeMs", "capturedTextMaxRecords", "capturedTextMaxAgeMs")
]


@pytest.mark.parametrize(("block", "key"), LIMIT_FIELDS)
@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (0, "must be a positive integer"),
        (-5, "must be a positive integer"),
        (True, "expected int, got bool"),
        (1.5, "expected int, got float"),
        ("10", "expected int, got str"),
        (None, "expected int, got null"),
    ],
)
def test_limits_and_retention_must_be_positive_integers(
    cfg_dir: Path, block: str, key: str, value: Any, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(cfg_dir, {"continuations": {block: {key: value}}})
    assert caught.value.path == f"continuations.{block}.{key}"
    assert fragment in caught.value.problem


@pytest.mark.parametrize(("block", "key"), LIMIT_FIELDS)
def test_limits_and_retention_accept_one(cfg_dir: Path, block: str, key: str) -> None:
    config = load(cfg_dir, {"continuations": {block: {key: 1}}})
    snake = "".join("_" + c.lower() if c.isupper() else c for c in key)
    assert getattr(getattr(config, block), snake) == 1


def test_errors_from_config_from_mapping_carry_the_same_paths(cfg_dir: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({"continuations": {"port": 0}}, str(cfg_dir), environ={})
    assert caught.value.path == "continuations.port"
    with pytest.raises(ConfigError) as caught:
        config_from_mapping([], str(cfg_dir), environ={})  # type: ignore[arg-type]
    assert caught.value.path == "$"


# ---------------------------------------------------------------------------------------------
# The file itself.


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"continuations": {"port": 4319,}}', "is not valid JSON"),
        ("", "is not valid JSON"),
        ('{"continuations": {"host": "127.0.0.1", "host": "0.0.0.0"}}', 'duplicate key "host"'),
        ('{"continuations": {"port": NaN}}', "is not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_unparseable_file_names_the_file(cfg_dir: Path, text: str, fragment: str) -> None:
    path = write(cfg_dir, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    err = caught.value
    assert err.path == "$"
    assert fragment in err.problem
    assert err.file == str(path)
    if "expected a JSON object" not in fragment:
        assert str(path) in str(err)


def test_missing_and_non_utf8_files_are_config_errors(cfg_dir: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(cfg_dir / "absent.json", environ={})
    assert caught.value.path == "$" and str(cfg_dir / "absent.json") in str(caught.value)
    path = cfg_dir / "latin1.json"
    path.write_bytes(b'{"continuations": {"stateDir": "\xe9"}}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path, environ={})


def test_byte_order_mark_is_accepted(cfg_dir: Path) -> None:
    path = cfg_dir / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"continuations": {"port": 4401}}).encode())
    assert load_config(path, environ={}).port == 4401


# ---------------------------------------------------------------------------------------------
# The MCP config.


def test_mcp_servers_are_parsed_in_the_common_format(cfg_dir: Path) -> None:
    config = load(cfg_dir, {"tools": {"mcpConfigPath": "mcp.json"}})
    servers = config.mcp_servers
    assert set(servers) == set(MCP["mcpServers"])
    stdio = servers["work-control"]
    assert stdio.transport == "stdio"
    assert (stdio.command, stdio.args) == ("python", ("-m", "work_control"))
    assert stdio.env == {"API_KEY": "mcp-env-secret-value"}
    assert stdio.cwd == str(cfg_dir / "tools")
    # Without a cwd a stdio server runs beside the MCP config, so relative args name files there.
    assert servers["typed-stdio"].transport == "stdio" and servers["typed-stdio"].cwd == str(cfg_dir)
    assert servers["local-http"].transport == "http"  # url and no type
    assert servers["local-http"].headers == {"Authorization": "Bearer mcp-hdr-secret"}
    assert servers["local-typed"].transport == "http"
    assert servers["local-v6"].transport == "http"
    assert servers["remote-http"].transport == "http"
    assert servers["local-sse"].transport == "sse"


def test_loopback_http_servers_can_be_selected(cfg_dir: Path) -> None:
    names = ["work-control", "typed-stdio", "local-http", "local-typed", "local-v6"]
    config = load(cfg_dir, {"tools": {"mcpConfigPath": "mcp.json", "continuationServers": names}})
    assert config.continuation_servers == tuple(names)


def test_mcp_config_path_may_be_absolute(cfg_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "servers.json").write_text(json.dumps({"mcpServers": {"s": {"command": "x", "cwd": "."}}}))
    config = load(
        cfg_dir, {"tools": {"mcpConfigPath": str(other / "servers.json"), "continuationServers": ["s"]}}
    )
    assert config.mcp_config_path == str(other / "servers.json")
    assert config.mcp_servers["s"].cwd == str(other)


def test_path_like_command_resolves_in_the_server_cwd_and_bare_names_stay_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "cfg"
    folder.mkdir()
    servers = {
        "rel": {"command": "./bin/srv", "args": ["a.py"]},
        "in-cwd": {"command": "bin/srv", "cwd": "tools"},
        "bare": {"command": "python3", "args": ["srv.py"]},
        "abs": {"command": "/usr/bin/env", "args": ["x"]},
    }
    (folder / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    (folder / "afterword.json").write_text(json.dumps({"tools": {"mcpConfigPath": "mcp.json"}}))
    monkeypatch.chdir(tmp_path)  # anywhere but the config folder
    parsed = load_config("cfg/afterword.json", environ={}).mcp_servers
    assert (parsed["rel"].command, parsed["rel"].cwd) == (str(folder / "bin" / "srv"), str(folder))
    assert parsed["rel"].args == ("a.py",)
    assert parsed["in-cwd"].command == str(folder / "tools" / "bin" / "srv")
    assert (parsed["bare"].command, parsed["bare"].cwd) == ("python3", str(folder))
    assert parsed["abs"].command == "/usr/bin/env"


MCP_INVALID: list[tuple[str, Any, str, str]] = [
    ("no mcpServers", {"servers": {}}, "mcpServers", "required key is missing"),
    ("mcpServers not object", {"mcpServers": []}, "mcpServers", "expected an object"),
    (
        "entry unknown key",
        {"mcpServers": {"s": {"command": "x", "envFile": ".env"}}},
        "mcpServers.s.envFile",
        "unknown",
    ),
    (
        "unknown type",
        {"mcpServers": {"s": {"type": "ws", "url": "ws://127.0.0.1"}}},
        "mcpServers.s.type",
        "'ws'",
    ),
    (
        "command and url",
        {"mcpServers": {"s": {"command": "x", "url": "http://127.0.0.1/mcp"}}},
        "mcpServers.s",
        "not both",
    ),
    ("neither", {"mcpServers": {"s": {}}}, "mcpServers.s.command", "non-empty command"),
    ("http without url", {"mcpServers": {"s": {"type": "http"}}}, "mcpServers.s.url", "needs a url"),
    (
        "stdio with headers",
        {"mcpServers": {"s": {"command": "x", "headers": {"a": "b"}}}},
        "mcpServers.s.headers",
        "",
    ),
    (
        "http with env",
        {"mcpServers": {"s": {"url": "http://127.0.0.1/m", "env": {"A": "b"}}}},
        "mcpServers.s.env",
        "",
    ),
    ("relative url", {"mcpServers": {"s": {"url": "/mcp"}}}, "mcpServers.s.url", "absolute http(s) URL"),
    (
        "env value not str",
        {"mcpServers": {"s": {"command": "x", "env": {"N": 1}}}},
        "mcpServers.s.env.N",
        "str",
    ),
    (
        "args not list",
        {"mcpServers": {"s": {"command": "x", "args": "a b"}}},
        "mcpServers.s.args",
        "expected array",
    ),
    (
        "odd server name",
        {"mcpServers": {"my server": {"type": "x"}}},
        'mcpServers["my server"].type',
        "unknown",
    ),
]


@pytest.mark.parametrize(
    ("mcp", "path", "fragment"), [r[1:] for r in MCP_INVALID], ids=[r[0] for r in MCP_INVALID]
)
def test_invalid_mcp_config_names_the_path_and_the_file(
    cfg_dir: Path, mcp: Any, path: str, fragment: str
) -> None:
    (cfg_dir / "bad-mcp.json").write_text(json.dumps(mcp))
    with pytest.raises(ConfigError) as caught:
        load(cfg_dir, {"tools": {"mcpConfigPath": "bad-mcp.json"}})
    err = caught.value
    assert err.path == path
    assert fragment in err.problem
    assert err.file == str(cfg_dir / "bad-mcp.json")
    assert str(cfg_dir / "bad-mcp.json") in str(err)


def test_unparseable_mcp_config_is_reported_at_mcp_config_path(cfg_dir: Path) -> None:
    (cfg_dir / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError) as caught:
        load(cfg_dir, {"tools": {"mcpConfigPath": "broken.json", "continuationServers": ["s"]}})
    assert caught.value.path == "tools.mcpConfigPath"
    assert str(cfg_dir / "broken.json") in caught.value.problem


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:9/mcp", True),
        ("https://localhost/mcp", True),
        ("http://[::1]:9/mcp", True),
        ("http://127.8.9.10/mcp", True),
        ("http://10.0.0.1/mcp", False),
        ("http://localhost.example.com/mcp", False),
        ("http://127.0.0.1.nip.io/mcp", False),
        ("ws://127.0.0.1/mcp", False),
        ("http://127.0.0.1:notaport/mcp", False),
        ("http://user@[::2]/mcp", False),
    ],
)
def test_is_loopback_url(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LocalHost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("localhost.example.com", False),
        ("[::1]", False),
        ("", False),
    ],
)
def test_is_loopback_host(host: str, loopback: bool) -> None:
    # The rule the server binds by and clients send credentials by (one definition).
    assert is_loopback_host(host) is loopback


def test_remote_http_error_does_not_echo_url_credentials(cfg_dir: Path) -> None:
    mcp = {"mcpServers": {"r": {"url": "https://user:pw-secret@tools.example.com/mcp?key=q-secret"}}}
    (cfg_dir / "r.json").write_text(json.dumps(mcp))
    with pytest.raises(ConfigError) as caught:
        load(cfg_dir, {"tools": {"mcpConfigPath": "r.json", "continuationServers": ["r"]}})
    assert caught.value.path == "tools.continuationServers[0]"
    assert "tools.example.com" in str(caught.value)
    assert "pw-secret" not in str(caught.value) and "q-secret" not in str(caught.value)


# ---------------------------------------------------------------------------------------------
# Detached tokens: read from the environment, checked, never stored or shown.

DETACHED = {
    "continuations": {"detachedServices": [{"name": "wc", "tokenEnv": "WORK_CONTROL_CONTINUATION_TOKEN"}]}
}


@pytest.mark.parametrize(
    ("token", "fragment"),
    [
        ("short-secret-15", "at least 16 characters"),  # 15 characters
        ("a" * 15, "at least 16 characters"),
        ("has a space in the token", "printable ASCII"),
        ("tab\tseparated-secret-xx", "printable ASCII"),
    ],
)
def test_bad_detached_token_is_rejected_without_showing_it(cfg_dir: Path, token: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(cfg_dir, DETACHED, env={"WORK_CONTROL_CONTINUATION_TOKEN": token})
    err = caught.value
    assert err.path == "continuations.detachedServices[0].tokenEnv"
    assert fragment in err.problem
    assert "WORK_CONTROL_CONTINUATION_TOKEN" in str(err)
    if token:
        assert token not in str(err) and token not in repr(err)


def test_unset_detached_token_disables_only_that_service(cfg_dir: Path) -> None:
    # A host or tool that makes no detached claims loads the config without the token.
    for env in ({}, {"WORK_CONTROL_CONTINUATION_TOKEN": ""}):
        config = load(cfg_dir, DETACHED, env=env)
        assert [s.name for s in missing_detached_tokens(config, env)] == ["wc"]
        with pytest.raises(ConfigError, match="WORK_CONTROL_CONTINUATION_TOKEN is not set"):
            detached_token(config, "wc", env)
    config = load(cfg_dir, DETACHED, env=ENV)
    assert missing_detached_tokens(config, ENV) == []


def test_token_of_exactly_16_characters_is_accepted(cfg_dir: Path) -> None:
    token = "0123456789abcdef"
    config = load(cfg_dir, DETACHED, env={"WORK_CONTROL_CONTINUATION_TOKEN": token})
    assert detached_token(config, "wc", {"WORK_CONTROL_CONTINUATION_TOKEN": token}) == token


def test_two_services_may_not_share_a_token_value(cfg_dir: Path) -> None:
    doc = {
        "continuations": {
            "detachedServices": [{"name": "a", "tokenEnv": "TOKEN_A"}, {"name": "b", "tokenEnv": "TOKEN_B"}]
        }
    }
    with pytest.raises(ConfigError) as caught:
        load(cfg_dir, doc, env={"TOKEN_A": TOKEN, "TOKEN_B": TOKEN})
    assert caught.value.path == "continuations.detachedServices[1].tokenEnv"
    assert TOKEN not in str(caught.value)
    config = load(cfg_dir, doc, env={"TOKEN_A": TOKEN, "TOKEN_B": TOKEN_2})
    assert detached_token(config, "b", {"TOKEN_A": TOKEN, "TOKEN_B": TOKEN_2}) == TOKEN_2


def test_token_is_never_in_the_config(cfg_dir: Path) -> None:
    config = load(cfg_dir, SPEC_EXAMPLE)
    assert TOKEN not in repr(config)
    assert TOKEN not in str(config)
    assert TOKEN.encode() not in msgspec.json.encode(config)
    assert detached_token(config, "work-control", ENV) == TOKEN


def test_detached_token_read_later_fails_closed_without_the_value(cfg_dir: Path) -> None:
    config = load(cfg_dir, SPEC_EXAMPLE)
    with pytest.raises(ConfigError) as caught:
        detached_token(config, "work-control", {"WORK_CONTROL_CONTINUATION_TOKEN": "tiny-val"})
    assert caught.value.path == "continuations.detachedServices[0].tokenEnv"
    assert "tiny-val" not in str(caught.value)
    with pytest.raises(KeyError):
        detached_token(config, "nobody", ENV)


def test_disabled_service_does_not_need_detached_tokens(cfg_dir: Path) -> None:
    doc = with_(SPEC_EXAMPLE, "continuations.enabled", False)
    config = load(cfg_dir, doc, env={})
    assert config.enabled is False
    assert "work-control" in config.detached_services
    # A short token is still checked while enabled, never when disabled.
    short = {"WORK_CONTROL_CONTINUATION_TOKEN": "short"}
    assert load(cfg_dir, doc, env=short).enabled is False
    with pytest.raises(ConfigError):
        load(cfg_dir, SPEC_EXAMPLE, env=short)


def test_no_config_error_repr_or_message_contains_a_token(cfg_dir: Path) -> None:
    secret_env = {"WORK_CONTROL_CONTINUATION_TOKEN": TOKEN, "TOKEN_B": TOKEN, "SHORT": TOKEN[:10]}
    broken = [
        with_(SPEC_EXAMPLE, "continuations.port", 0),
        with_(SPEC_EXAMPLE, "continuations.host", "10.0.0.1"),
        with_(
            SPEC_EXAMPLE,
            "continuations.detachedServices",
            [
                {"name": "a", "tokenEnv": "WORK_CONTROL_CONTINUATION_TOKEN"},
                {"name": "b", "tokenEnv": "TOKEN_B"},
            ],
        ),
        with_(SPEC_EXAMPLE, "continuations.detachedServices", [{"name": "a", "tokenEnv": "SHORT"}]),
        with_(SPEC_EXAMPLE, "tools.continuationServers", ["remote-http"]),
    ]
    for doc in broken:
        with pytest.raises(ConfigError) as caught:
            load(cfg_dir, doc, env=secret_env)
        for shown in (str(caught.value), repr(caught.value), caught.value.problem):
            assert TOKEN not in shown and TOKEN[:10] not in shown


def test_repr_masks_credentials_written_in_mcp_and_webhook_config(cfg_dir: Path) -> None:
    doc = {
        "tools": {"mcpConfigPath": "mcp.json"},
        "continuations": {
            "channels": {
                "*": {"adapter": "webhook", "url": "https://h/x", "headers": {"X-Key": "hook-secret"}}
            }
        },
    }
    config = load(cfg_dir, doc)
    text = repr(config)
    for secret in ("mcp-env-secret-value", "mcp-hdr-secret", "hook-secret"):
        assert secret not in text
    assert "API_KEY" in text and "X-Key" in text  # the names stay visible for debugging
    # The values themselves remain usable.
    assert config.mcp_servers["work-control"].env["API_KEY"] == "mcp-env-secret-value"


# ---------------------------------------------------------------------------------------------
# Synthesis and channels (docs/design.md, Contracts: channels and synthesis).


def test_openai_synthesis_defaults_and_api_key(cfg_dir: Path) -> None:
    config = load(cfg_dir, {"continuations": {"synthesis": {"provider": "openai", "model": "m1"}}})
    assert config.synthesis.base_url == "https://api.openai.com/v1"
    assert config.synthesis.api_key_env is None
    assert synthesis_api_key(config, {}) is None
    config = load(
        cfg_dir,
        {
            "continuations": {
                "synthesis": {
                    "provider": "openai",
                    "model": "m1",
                    "baseUrl": "http://127.0.0.1:8080/v1",
                    "apiKeyEnv": "LLM_KEY",
                }
            }
        },
        env={},
    )
    assert config.synthesis.base_url == "http://127.0.0.1:8080/v1"
    assert synthesis_api_key(config, {"LLM_KEY": "sk-local"}) == "sk-local"
    assert "sk-local" not in repr(config)
    with pytest.raises(ConfigError) as caught:
        synthesis_api_key(config, {})
    assert caught.value.path == "continuations.synthesis.apiKeyEnv"
    assert synthesis_api_key(load(cfg_dir, {"continuations": {}}), {"LLM_KEY": "x"}) is None


def test_channels_parse_each_adapter(cfg_dir: Path) -> None:
    doc = {
        "continuations": {
            "channels": {
                "slack": {"adapter": "slack", "tokenEnv": "SLACK_BOT_TOKEN", "allow": ["slack:C1"]},
                "fake": {"adapter": "slack", "tokenEnv": "T", "baseUrl": "http://127.0.0.1:7000/api/"},
                "hook": {"adapter": "webhook", "url": "https://hooks.example/x", "headers": {"X-A": "1"}},
                "*": {"adapter": "outbox"},
            }
        }
    }
    channels = load(cfg_dir, doc, env={}).channels
    assert channels["slack"] == SlackChannelConfig(
        base_url="https://slack.com/api", token_env="SLACK_BOT_TOKEN", allow=("slack:C1",)
    )
    assert channels["fake"] == SlackChannelConfig(base_url="http://127.0.0.1:7000/api", token_env="T")
    assert channels["hook"] == WebhookChannelConfig(url="https://hooks.example/x", headers={"X-A": "1"})
    assert channels["*"] == OutboxChannelConfig(path=str(cfg_dir / "outbox.jsonl"))
    assert [c.adapter for c in channels.values()] == ["slack", "slack", "webhook", "outbox"]


def test_channel_for_routes_by_first_segment_with_fallback(cfg_dir: Path) -> None:
    doc = {
        "continuations": {
            "channels": {"slack": {"adapter": "slack", "tokenEnv": "T"}, "*": {"adapter": "outbox"}}
        }
    }
    config = load(cfg_dir, doc, env={})
    assert config.channel_for("slack:C1:T1") == ("slack", config.channels["slack"])
    assert config.channel_for("cli:local") == ("*", config.channels["*"])
    assert config.channel_for("slack") == ("slack", config.channels["slack"])
    only_slack = load(
        cfg_dir, {"continuations": {"channels": {"slack": {"adapter": "slack", "tokenEnv": "T"}}}}
    )
    assert only_slack.channel_for("teams:X") is None


@pytest.mark.parametrize(
    ("allow", "conversation_id", "allowed"),
    [
        (None, "anything:at:all", True),
        ((), "slack:C1", False),
        (("slack:C1",), "slack:C1", True),
        (("slack:C1",), "slack:C1:T9", True),
        (("slack:C1",), "slack:C10", False),
        (("slack:C1",), "slack:C10:T1", False),
        (("slack:",), "slack:C10:T1", True),
        (("slack:C1:T1",), "slack:C1:T2", False),
        (("slack:C2", "slack:C1"), "slack:C1:T2", True),
    ],
)
def test_channel_allows(allow: tuple[str, ...] | None, conversation_id: str, allowed: bool) -> None:
    channel = OutboxChannelConfig(path="/o", allow=allow)
    assert channel_allows(channel, conversation_id) is allowed


def test_request_context_servers_are_independent_of_continuation_servers(tmp_path: Path) -> None:
    import json as _json

    (tmp_path / "mcp.json").write_text(
        _json.dumps({"mcpServers": {"work-control": {"command": "x"}, "context-only": {"command": "y"}}})
    )
    doc = {
        "tools": {
            "mcpConfigPath": "./mcp.json",
            "continuationServers": ["work-control"],
            "mcpRequestContextServers": ["context-only", "work-control"],
        }
    }
    (tmp_path / "afterword.json").write_text(_json.dumps(doc))
    config = load_config(tmp_path / "afterword.json", environ={})
    assert config.continuation_servers == ("work-control",)


def test_channel_settings_and_channel_adapters_have_different_names() -> None:
    import afterword.config as config_module
    from afterword.worker import channels as adapters

    for kind in ("Outbox", "Slack", "Webhook"):
        settings = getattr(config_module, f"{kind}ChannelConfig")
        assert settings.__name__ == f"{kind}ChannelConfig"
        assert getattr(adapters, settings.__name__, None) is None
        # The adapter's name is not a second name of the settings class.
        assert getattr(config_module, f"{kind}Channel", None) is None


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(st.characters(max_codepoint=200), min_size=1, max_size=40), st.text(min_size=1)))
def test_an_env_secret_is_exactly_printable_ascii_without_spaces(value: str) -> None:
    wanted = all(33 <= ord(char) <= 126 for char in value)
    try:
        assert read_env_secret("X", path="p", environ={"X": value}) == value
        accepted = True
    except ConfigError:
        accepted = False
    assert accepted == wanted, repr(value)
    for char in ("\x00", "\x1f", " ", "\x7f", "\x80", "é", "\u00a0"):
        with pytest.raises(ConfigError):
            read_env_secret("X", path="p", environ={"X": "token" + char})

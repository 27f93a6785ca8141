"""Helpers for tests that run the real service on a free loopback port."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

import afterword
from afterword.config import Config

DETACHED_TOKEN = "detached-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def deadline(days: float = 1.0) -> str:
    dt = datetime.now(UTC) + timedelta(days=days)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def payload_hash(payload: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()


def write_config(
    root: Path,
    *,
    continuations: Mapping[str, Any] | None = None,
    servers: Mapping[str, Any] | None = None,
    selected: list[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write mcp.json and afterword.json under ``root`` (0700) and return the config path."""
    os.chmod(root, 0o700)
    mcp = {"mcpServers": dict(servers or {"work-control": {"command": "python3", "args": ["-c", "pass"]}})}
    (root / "mcp.json").write_text(json.dumps(mcp))
    block: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": free_port(),
        "stateDir": "state",
        "namedRoutes": {
            "daily-attention": {"mode": "notify_if_actionable", "conversationId": "slack:C_DAILY:T_1"},
            "verification": {"mode": "capture", "conversationId": "local:verify"},
            "background-index": {"mode": "silent"},
        },
        "detachedServices": [{"name": "work-control", "tokenEnv": "AFTERWORD_TEST_DETACHED_TOKEN"}],
    }
    block.update(continuations or {})
    doc: dict[str, Any] = {
        "tools": {"mcpConfigPath": "./mcp.json", "continuationServers": selected or ["work-control"]},
        "continuations": block,
    }
    doc.update(extra or {})
    path = root / "afterword.json"
    path.write_text(json.dumps(doc))
    return path


def load(path: Path) -> Config:
    return afterword.load_config(path, environ={"AFTERWORD_TEST_DETACHED_TOKEN": DETACHED_TOKEN})


ENV = {"AFTERWORD_TEST_DETACHED_TOKEN": DETACHED_TOKEN}


def outbox_lines(config: Config) -> list[dict[str, Any]]:
    path = Path(config.config_dir) / "outbox.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

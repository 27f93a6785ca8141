"""Shared by the task follower's tests: skip cleanly where the SDK 2.x line is missing."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest


def require_sdk2() -> None:
    try:
        found = version("mcp")
    except PackageNotFoundError:
        found = "none"
    if not found.startswith("2."):
        pytest.skip(
            f"the MCP Tasks extension (protocol 2026-07-28) needs the Python SDK 2.x; installed: mcp {found}",
            allow_module_level=True,
        )

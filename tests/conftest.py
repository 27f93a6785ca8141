"""Shared fixtures. Async tests run on the asyncio backend only."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cli import FakeWebhook
from _node import built_node


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def state_dir(tmp_path: Path) -> str:
    """A not-yet-existing state directory under an owner-only parent."""
    os.chmod(tmp_path, 0o700)
    return str(tmp_path / "state")


@pytest.fixture
def hook() -> Iterator[FakeWebhook]:
    """A scriptable webhook receiver on loopback (hangs 5 s on a `:hang` route)."""
    fake = FakeWebhook(hang_s=5.0)
    yield fake
    fake.close()


@pytest.fixture(scope="session")
def node() -> str:
    """Node >= 20 with the TypeScript client compiled (once per source state, see _node.py)."""
    return built_node()

"""Each module has one import path: the deprecated re-exports of issue 16 are gone, the two
stable public aliases stay, and no class keeps a second name that collides with another."""

from __future__ import annotations

import importlib

import pytest

import afterword.config
import afterword.continuations

REMOVED = [
    "afterword.service",
    "afterword.repository",
    "afterword.views",
    "afterword.wire",
    "afterword.demo",
    "afterword.doctor",
    "afterword.serve",
    "afterword.metrics",
    "afterword.operator",
    "afterword.host",
    "afterword.host.binding",
    "afterword.tasks.cli",
]


# (``afterword.runtime`` was one of them too; it is now the composition root itself.)
@pytest.mark.parametrize("old", REMOVED)
def test_a_removed_old_path_does_not_import(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


@pytest.mark.parametrize(
    ("alias", "home"),
    [
        ("afterword.producer", "afterword.clients.producer"),
        ("afterword.mcp_host", "afterword.clients.mcp_sessions"),
    ],
)
def test_a_stable_public_name_reexports_its_home(alias: str, home: str) -> None:
    public, target = importlib.import_module(alias), importlib.import_module(home)
    assert public.__all__ == target.__all__
    for name in target.__all__:
        assert getattr(public, name) is getattr(target, name), name


def test_no_colliding_aliases() -> None:
    # ``TooLarge`` is the producer's client-side error; ``OutboxChannel`` & co. the worker's adapters.
    assert not hasattr(afterword.continuations, "TooLarge")
    for name in ("OutboxChannel", "SlackChannel", "WebhookChannel"):
        assert not hasattr(afterword.config, name), name

"""Detached-service authentication: a missing token is a 401, a bug is not disguised as one."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from _service import DETACHED_TOKEN, ENV, load, write_config

import afterword
import afterword.app.claims as claims_module
from afterword.continuations import Unauthorized


def _outcome(tmp_path: Path, environ: dict[str, str], token: str) -> Exception | None:
    """What ``authenticate_detached`` raised (caught inside, so no task group wraps it)."""
    tmp_path.mkdir(mode=0o700, exist_ok=True)
    config = load(write_config(tmp_path))
    raised: list[Exception] = []

    async def run() -> None:
        async with afterword.open_service(config, environ=environ, serve_http=False, run_worker=False) as svc:
            try:
                svc.authenticate_detached("work-control", token)
            except Exception as exc:
                raised.append(exc)

    anyio.run(run)
    return raised[0] if raised else None


def test_right_token_passes_and_a_wrong_or_unset_one_is_unauthorized(tmp_path: Path) -> None:
    assert _outcome(tmp_path / "ok", ENV, DETACHED_TOKEN) is None
    assert isinstance(_outcome(tmp_path / "wrong", ENV, DETACHED_TOKEN[:-1]), Unauthorized)
    # The token variable is not set: no token can match.
    assert isinstance(_outcome(tmp_path / "unset", {}, DETACHED_TOKEN), Unauthorized)


def test_a_failure_other_than_configuration_is_not_turned_into_401(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> str:
        raise RuntimeError("a bug while reading the token")

    monkeypatch.setattr(claims_module, "read_detached_token", broken)
    outcome = _outcome(tmp_path, ENV, DETACHED_TOKEN)
    assert isinstance(outcome, RuntimeError) and "a bug" in str(outcome)

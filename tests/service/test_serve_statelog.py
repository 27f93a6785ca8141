"""``serve``'s state-change log: lines are written a loop tick at a time, keep their order
against every other log line, keep their format, and none is lost when serve stops, fails or
is cancelled."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from _claims import make_claim
from _service import load, write_config

from afterword.app.ports import ChangeListener
from afterword.cli import serve as serve_module
from afterword.cli.serve import serve
from afterword.cli.statelog import StateChangeLog
from afterword.continuations.model import Continuation, ErrorInfo
from afterword.http.server import ServeError

pytestmark = pytest.mark.anyio


def _record(cid: str, state: str = "claimed") -> Continuation:
    claim = make_claim(id=cid, created_at_ms=1, deadline_ms=10**13, mode="notify_if_actionable")
    return Continuation(claim=claim, claim_mac="mac", state=state)  # type: ignore[arg-type]


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


async def test_one_ticks_changes_are_written_in_one_call_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    log = StateChangeLog()
    recs = [_record(f"c_{i}") for i in range(5)]
    for rec in recs:
        log(None, rec)
    assert capsys.readouterr().err == ""  # collected, not written yet
    await anyio.lowlevel.checkpoint()
    await anyio.lowlevel.checkpoint()
    assert log.writes == 1
    assert [e["id"] for e in _events(capsys.readouterr().err)] == [r.id for r in recs]


async def test_the_line_format_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    old = _record("c_fmt", "synthesizing")
    new = msgspec.structs.replace(
        old, state="dead_lettered", last_error=ErrorInfo(code="boom", message="secret")
    )
    log = StateChangeLog()
    log(old, new)
    log(new, new)  # not a change of state or origin: no line
    log.flush()
    (line,) = capsys.readouterr().err.splitlines()
    event = json.loads(line)
    assert isinstance(event.pop("ts"), float)
    assert event == {
        "event": "continuation",
        "id": "c_fmt",
        "from": "synthesizing",
        "to": "dead_lettered",
        "origin": "pending",
        "mode": "notify_if_actionable",
        "server": "work-control",
        "attempts": {"synthesis": 0, "delivery": 0},
        "error": "boom",
    }
    # Byte for byte as before batching (readers match substrings such as '"to":"delivered"').
    assert line.split(",", 1)[1] == (
        '"event":"continuation","id":"c_fmt","from":"synthesizing","to":"dead_lettered",'
        '"origin":"pending","mode":"notify_if_actionable","server":"work-control",'
        '"attempts":{"synthesis":0,"delivery":0},"error":"boom"}'
    )
    assert "secret" not in line  # an error's message is never logged, only its code


async def test_a_log_record_never_overtakes_an_earlier_change(capsys: pytest.CaptureFixture[str]) -> None:
    log = StateChangeLog()
    handler = serve_module.log_handler()
    handler.addFilter(log.filter)
    logger = logging.getLogger("afterword.test-statelog")
    logger.addHandler(handler)
    logger.propagate = False
    level = logger.level
    logger.setLevel(logging.DEBUG)  # independent of the "afterword" level another test module may raise
    try:
        log(None, _record("c_before"))
        logger.warning("between")
        log(None, _record("c_after"))
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(level)
    ours = {"c_before", "between", "c_after"}  # lines other code may log meanwhile are not ours
    text = capsys.readouterr().err
    order = [e.get("id") or e.get("message") for e in _events(text)]
    assert [x for x in order if x in ours] == ["c_before", "between", "c_after"], (order, text)


async def test_outside_a_loop_a_line_is_written_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    log = StateChangeLog()
    await anyio.to_thread.run_sync(log, None, _record("c_thread"))
    assert [e["id"] for e in _events(capsys.readouterr().err)] == ["c_thread"]


def _fake_service(body: str) -> Any:
    """An ``open_service`` stand-in: reports one state change, then ``body`` decides the rest."""

    @asynccontextmanager
    async def fake(
        config: Any, *, channels: Any = None, on_change: Sequence[ChangeListener] = ()
    ) -> AsyncIterator[None]:
        for fn in on_change:
            fn(None, _record("c_last"))
        if body == "serve_error":
            raise ServeError("cannot listen on 127.0.0.1:1: in use")
        if body == "crash":
            raise RuntimeError("the service broke")
        if body == "hang":
            await anyio.sleep_forever()
        yield

    return fake


@pytest.mark.parametrize("body", ["serve_error", "crash", "hang"])
async def test_no_change_is_lost_when_serve_fails_or_is_cancelled(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load(write_config(tmp_path))
    monkeypatch.setattr(serve_module, "open_service", _fake_service(body))
    if body == "serve_error":
        assert await serve(config) == 1
    elif body == "crash":
        with pytest.raises(RuntimeError):
            await serve(config)
    else:
        with anyio.move_on_after(0):  # cancelled before the loop's next pass
            await serve(config)
    # Read before the loop runs again: only serve's own exit path can have written the line.
    lines = capsys.readouterr().err.splitlines()
    assert json.loads(lines[0])["id"] == "c_last", lines
    if body == "serve_error":
        assert lines[1:] == ["afterword: cannot listen on 127.0.0.1:1: in use"]

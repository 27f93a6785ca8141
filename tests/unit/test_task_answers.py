"""The one reader of a ``tasks/get`` answer, as both followers (host and service) use it."""

from __future__ import annotations

from typing import Any

import pytest

from afterword.clients.mcp_task_wire import MalformedTask, outcome_of
from afterword.protocol.taskanswers import Malformed, Polled, answer_from_result


def _answer(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "taskId": "t-1",
        "status": "completed",
        "result": {"content": [{"type": "text", "text": "done"}], "isError": False},
    }
    raw.update(changes)
    return raw


BROKEN = [
    _answer(result={"content": [], "isError": "true"}),  # a string is not a boolean
    _answer(result={"content": [], "isError": 1}),
    _answer(result={"content": "done"}),
    _answer(pollIntervalMs=-5),
    _answer(pollIntervalMs=True),
    _answer(taskId="t-\x01"),
    _answer(taskId="x" * 10_000),
    _answer(taskId="t-2"),
    _answer(status="done"),
    _answer(result=None),
]


@pytest.mark.parametrize("raw", BROKEN)
def test_an_answer_breaking_the_protocol_is_malformed_on_both_paths(raw: dict[str, Any]) -> None:
    judged = answer_from_result(raw, raw["taskId"] if raw["taskId"] != "t-2" else "t-1")
    assert isinstance(judged, Malformed)
    assert "\x01" not in judged.detail and "xxxx" not in judged.detail  # the value is never echoed
    with pytest.raises(MalformedTask):
        outcome_of(raw, "t-1")


def test_a_well_formed_answer_reads_the_same_on_both_paths() -> None:
    raw = _answer(pollIntervalMs=250, result={"content": [], "isError": True})
    judged = answer_from_result(raw, "t-1")
    assert isinstance(judged, Polled)
    assert outcome_of(raw, "t-1") == judged.outcome
    assert judged.outcome.result == {"content": [], "isError": True}
    assert judged.outcome.poll_interval_ms == 250

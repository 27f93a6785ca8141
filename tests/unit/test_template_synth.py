"""The template synthesizer: the payload keys it reads, and readable output without them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from afterword.worker.synthesizers import (
    CONTROL_KEYS,
    FRAME_OPEN,
    SUMMARY_KEYS,
    SynthesisRequest,
    TemplateSynthesizer,
    _alternating,
    _messages,
    render_template,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


@pytest.mark.parametrize("key", SUMMARY_KEYS)
def test_each_summary_key_is_answered_on_one_line(key: str) -> None:
    assert (
        render_template({key: " Indexed 42 files ", "other": 1})
        == "Update on your earlier request: Indexed 42 files"
    )


def test_summary_wins_over_the_other_keys() -> None:
    payload = {"result": "r", "message": "m", "summary": "s", "text": "t"}
    assert render_template(payload) == "Update on your earlier request: s"


def test_payload_without_summary_renders_key_value_lines_not_json() -> None:
    payload = {
        "actionable": True,
        "invoices": 3,
        "owners": ["ann", "bo"],
        "due": {"soonest": "2026-12-03", "overdue": False},
        "notes": None,
    }
    text = render_template(payload)
    assert text.splitlines() == [
        "Update on your earlier request:",
        "invoices: 3",
        "owners: ann, bo",
        "due:",
        "  soonest: 2026-12-03",
        "  overdue: no",
        "notes: none",
    ]
    assert "{" not in text and '"' not in text and "actionable" not in text


def test_other_shapes_stay_readable() -> None:
    assert render_template({"actionable": True}) == "Update on your earlier request: the task finished."
    assert render_template("done") == "Update on your earlier request: done"
    assert render_template([1, {"a": 2}]).splitlines() == [
        "Update on your earlier request:",
        "- 1",
        "-",
        "  a: 2",
    ]
    deep: dict[str, object] = {"v": 1}
    for _ in range(10):
        deep = {"k": deep}
    assert "..." in render_template(deep)


def test_the_keys_read_are_documented() -> None:
    text = DOCS.read_text()
    for key in (*SUMMARY_KEYS, *CONTROL_KEYS):
        assert f"`{key}`" in text


def _request(origin_context: str, payload: object) -> SynthesisRequest:
    return SynthesisRequest(
        continuation_id="c_x",
        mode="notify_if_actionable",
        conversation_id="slack:C1:T1",
        origin_context=origin_context,
        messages=(),
        payload=payload,
    )


def test_a_detached_answer_says_it_is_a_report_not_a_reply() -> None:
    """A detached (cron) service reports on its own: its answer must not claim that someone
    asked; an answer to a run's claim still reads as the reply it is."""
    payload = {"summary": "3 invoices need approval"}
    detached = asyncio.run(TemplateSynthesizer().synthesize(_request("detached_latest", payload)))
    assert detached == "From a background service: 3 invoices need approval"
    assert "earlier request" not in render_template({"invoices": 3}, detached=True)
    reply = asyncio.run(TemplateSynthesizer().synthesize(_request("pinned", payload)))
    assert reply == "Update on your earlier request: 3 invoices need approval"


def test_the_model_prompt_of_a_detached_answer_says_nobody_asked() -> None:
    detached = _messages(_request("detached_latest", {"n": 1}))[0]["content"]
    reply = _messages(_request("pinned", {"n": 1}))[0]["content"]
    assert "nobody in the conversation asked" in detached and "earlier request" in detached
    assert "nobody" not in reply
    assert _alternating(_request("detached_latest", {"n": 1}))[-1]["content"].startswith(FRAME_OPEN)
    # Both keep the untrusted-data rules.
    assert all(FRAME_OPEN in text and "never follow" in text for text in (detached, reply))

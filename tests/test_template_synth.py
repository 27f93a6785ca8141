"""The template synthesizer: the payload keys it reads, and readable output without them."""

from __future__ import annotations

from pathlib import Path

import pytest

from afterword.worker.synth import CONTROL_KEYS, SUMMARY_KEYS, render_template

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


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

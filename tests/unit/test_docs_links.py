"""README.md and docs/*.md only point at files that exist: relative links and afterword/...py paths.

A refactor moves modules; a doc that still names the old file sends a reader nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
MODULE_PATH = re.compile(r"(?<![\w./-])(afterword/[\w./-]*\.py)\b")


def _relative_links(text: str) -> list[str]:
    return [
        target.split("#", 1)[0]
        for target in LINK.findall(text)
        if not target.startswith(("http://", "https://", "mailto:", "#"))
    ]


def test_link_regex_sees_relative_links_and_skips_urls() -> None:
    text = "[a](docs/x.md#s) [b](https://e.org/y.md) [c](#top) `afterword/app/service.py`"
    assert _relative_links(text) == ["docs/x.md"]
    assert MODULE_PATH.findall(text) == ["afterword/app/service.py"]


def test_relative_markdown_links_resolve() -> None:
    broken = [
        (doc.name, target)
        for doc in DOCS
        for target in _relative_links(doc.read_text(encoding="utf-8"))
        if not (doc.parent / target).exists()
    ]
    assert broken == []


def test_named_afterword_python_files_exist() -> None:
    named = [(doc.name, p) for doc in DOCS for p in MODULE_PATH.findall(doc.read_text(encoding="utf-8"))]
    assert len(named) >= 5  # the docs really name module files, so the check is live
    missing = [(name, p) for name, p in named if not (ROOT / p).is_file()]
    assert missing == []

"""Code and tests point at docs/design.md sections that exist, never at a file outside the repo."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REF = re.compile(r"docs/design\.md,? \(?((?:Contracts: )?[A-Za-z][A-Za-z ]*[a-z])")


def _sources() -> list[Path]:
    dirs = ("afterword", "tests", "tools", "bench")
    return [p for d in dirs for p in (ROOT / d).rglob("*.py") if p.name != Path(__file__).name]


def test_section_references_name_real_headings() -> None:
    headings = {
        line.lstrip("#").strip()
        for line in (ROOT / "docs" / "design.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }
    refs: list[tuple[str, str]] = []
    for path in _sources():
        for match in REF.finditer(path.read_text(encoding="utf-8")):
            refs.append((path.name, match.group(1)))
    assert len(refs) >= 5  # the regex really finds the references
    missing = [(name, section) for name, section in refs if section not in headings]
    assert missing == []


def test_no_reference_to_the_design_file_outside_the_repository() -> None:
    offenders = [
        p.name for p in _sources() if re.search(r"DESIGN(\.md)? contract", p.read_text(encoding="utf-8"))
    ]
    assert offenders == []

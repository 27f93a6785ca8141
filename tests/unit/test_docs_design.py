"""Code and tests point at docs/design.md sections that exist, never at a file outside the repo."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def test_docs_name_the_format_the_store_writes() -> None:
    """The format name in the docs follows the store's, and every format the store still
    upgrades has its section in docs/upgrading.md."""
    from afterword.store import codec

    docs = ROOT / "docs"
    upgrading = (docs / "upgrading.md").read_text(encoding="utf-8")
    assert upgrading.splitlines()[0].endswith(f"`{codec.FORMAT}`")
    assert (
        (docs / "storage-format.md").read_text(encoding="utf-8").splitlines()[0].endswith(f"`{codec.FORMAT}`")
    )
    design = (docs / "design.md").read_text(encoding="utf-8")
    assert f"`{codec.FORMAT}`" in design
    named = set(re.findall(r"`(per-record-v\d+)`", design))
    assert named == {codec.FORMAT}
    older = sorted((codec.FORMAT_V3, codec.FORMAT_V4), key=lambda f: int(f.rsplit("v", 1)[1]))
    for old, new in zip(older, [*older[1:], codec.FORMAT], strict=True):
        assert f"## From `{old}` to `{new}`" in upgrading

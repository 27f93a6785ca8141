"""The test tree shows what each test needs (tests/README.md): every test module sits in the
tree that tests/_layout.py names for it, and no two share a name (the trees import each other's
modules by name)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from _layout import TREES, kind_of

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_sits_in_a_tree() -> None:
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []  # tests/test_x.py: run _layout.py on it
    assert {p.parent.name for p in TESTS.rglob("test_*.py")} == set(TREES)


def test_every_test_module_sits_in_the_tree_its_imports_call_for() -> None:
    misplaced = {
        f"{p.parent.name}/{p.name}": kind
        for tree in TREES
        for p in (TESTS / tree).glob("test_*.py")
        if (kind := kind_of(p, TESTS)) != tree
    }
    assert misplaced == {}, "move each to the tree named (python tests/_layout.py FILE says why)"


def test_test_module_names_are_unique_across_the_trees() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [name for name, n in names.items() if n > 1] == []


def test_the_rule_sees_a_process_a_server_and_neither(tmp_path: Path) -> None:
    cases = {
        "e2e": "import subprocess\n\ndef test_x() -> None:\n    subprocess.run(['true'])\n",
        "e2e ": "from _cli import served\n",
        "service": "from fakes.harness import running\n",
        "service ": "import afterword\n\nasync def test_x() -> None:\n    afterword.open_service\n",
        "unit": '"""Calls subprocess in a docstring only."""\nfrom afterword.continuations import lifecycle\n',
    }
    for want, source in cases.items():
        path = tmp_path / "test_case.py"
        path.write_text(source)
        assert kind_of(path, TESTS) == want.strip(), source

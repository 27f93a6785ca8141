"""The key-derivation labels: one list, and each label still derives the key it always did.

The state directory stores only the secret; tokens handed out earlier and claim MACs already
on disk are checked against keys re-derived from it. A renamed label would silently break
them, so every label is pinned here against an HMAC computed in the test itself.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
from pathlib import Path

import pytest

from afterword.store import keys

ROOT = Path(__file__).resolve().parents[2]
SECRET = bytes(range(32))

# Typed out here, not read from the module: constant name -> the label bytes on disk.
EXPECTED = {
    "CONTINUATION_IDS": b"continuation-ids",
    "RESULT_TOKENS": b"result-tokens",
    "CLAIM_CAPABILITIES": b"claim-capabilities",
    "OPERATOR": b"operator",
    "METRICS": b"metrics",
    "CLAIM_BINDING": b"claim-binding",
    "OPERATOR_CURSOR": b"operator-cursor",
    "BLOB_BINDING": b"blob-binding",
    "HOST": b"host",
    "STATUS_PAGE": b"status-page",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_label_derives_the_same_key_as_before(name: str) -> None:
    label = getattr(keys, name)
    independent = hmac.new(SECRET, b"afterword/v3/" + EXPECTED[name], hashlib.sha256).digest()
    assert keys.derive_key(SECRET, label) == independent


def test_two_derived_keys_are_pinned_byte_for_byte() -> None:
    # Computed once when the labels moved into one module; guards the construction itself.
    assert keys.derive_key(SECRET, keys.OPERATOR).hex() == (
        "5931c2ad6cbb0aa00929e79ac8f897330a78df1f76f4f893164055b3b634e72b"
    )
    assert keys.derive_key(SECRET, keys.CLAIM_BINDING).hex() == (
        "e77c43e5d52944ab8873b574c416080cb96b08ab8bcb38918ca153c8f5dfce8a"
    )


def test_the_module_lists_exactly_these_labels() -> None:
    assert sorted(p.encode() for p in keys.PURPOSES) == sorted(EXPECTED.values())
    assert len({keys.derive_key(SECRET, p) for p in keys.PURPOSES}) == len(EXPECTED)


def _derive_calls(path: Path) -> list[tuple[int, ast.expr]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name == "derive_key":
                calls.append((node.lineno, node.args[1]))
    return calls


def test_every_caller_names_a_label_from_the_keys_module() -> None:
    """A label spelled out at a call site is how they drifted into several files before."""
    spelled_out = []
    for folder in ("afterword", "tools", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "afterword" / "store" / "keys.py":
                continue
            for line, arg in _derive_calls(path):
                if isinstance(arg, ast.Constant):
                    spelled_out.append(f"{path.relative_to(ROOT)}:{line}")
    assert spelled_out == []

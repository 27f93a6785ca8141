"""The durability layer's supported surface: the names docs/durability-layer.md and
examples/jobqueue/ use, with their signatures, recorded in tests/unit/api_surface.json.

The surface is computed from the code itself: every name imported from ``afterword`` or
``tools.crashsim`` in the guide's Python blocks and the job queue's modules, and, for each
imported class, every public member whose name the code uses as an attribute. The test fails
when a recorded name disappears or its signature changes, and when the code starts using a
name the file does not record. After a deliberate change, rewrite the file with
``AFTERWORD_API_SURFACE=write python -m pytest tests/unit/test_api_surface.py``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tools/ and examples/ are top-level folders, not installed
    sys.path.insert(0, str(ROOT))

SNAPSHOT = Path(__file__).with_name("api_surface.json")
GUIDE = ROOT / "docs" / "durability-layer.md"
EXAMPLE = ROOT / "examples" / "jobqueue"
PUBLIC_MODULES = ("afterword", "tools.crashsim")
# Attributes set on an open store rather than on its class (BlobStore needs both), with the
# class of each whose members the code may use (the job queue asks root.check_writable()).
INSTANCE_ATTRIBUTES = {"afterword.store.RecordStore": {"root": "afterword.disk.StateRoot", "secret": ""}}


def sources() -> Iterator[tuple[str, str]]:
    text = GUIDE.read_text()
    for n, body in enumerate(re.findall(r"^```python\n(.*?)^```", text, re.M | re.S), 1):
        yield f"{GUIDE.name} block {n}", body
    for path in sorted(EXAMPLE.glob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text()


def describe(obj: object) -> str:
    if isinstance(obj, property):
        return "property"
    if isinstance(obj, classmethod | staticmethod):
        return f"{type(obj).__name__} {inspect.signature(obj.__func__)}"
    if inspect.ismemberdescriptor(obj) or inspect.isgetsetdescriptor(obj):
        return "field"
    if inspect.isclass(obj) or callable(obj):
        try:
            return f"{'class' if inspect.isclass(obj) else 'def'} {inspect.signature(obj)}"  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return "class" if inspect.isclass(obj) else "callable"
    return f"value of type {type(obj).__name__}"


def surface() -> dict[str, str]:
    imported: set[tuple[str, str]] = set()
    attributes: set[str] = set()  # used as attributes, or defined by a subclass (overrides)
    for _where, code in sources():
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PUBLIC_MODULES):
                imported.update((node.module, alias.name) for alias in node.names)
            elif isinstance(node, ast.Attribute):
                attributes.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                attributes.update(
                    f.name for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                )
    out: dict[str, str] = {}
    for module, name in sorted(imported):
        qual = f"{module}.{name}"
        obj = getattr(importlib.import_module(module), name, None)
        if obj is None:
            out[qual] = "missing"
            continue
        out[qual] = describe(obj)
        if inspect.isclass(obj):
            for attr in sorted(attributes):
                inherited = hasattr(BaseException, attr)  # args, with_traceback: Python's, not ours
                if not attr.startswith("_") and hasattr(obj, attr) and not inherited:
                    out[f"{qual}.{attr}"] = describe(inspect.getattr_static(obj, attr))
            for attr, kind in INSTANCE_ATTRIBUTES.get(qual, {}).items():
                out[f"{qual}.{attr}"] = f"instance attribute {kind}".strip()
                if kind:
                    module_name, _, class_name = kind.rpartition(".")
                    cls = getattr(importlib.import_module(module_name), class_name)
                    for member in sorted(attributes):
                        if not member.startswith("_") and hasattr(cls, member):
                            out[f"{qual}.{attr}.{member}"] = describe(inspect.getattr_static(cls, member))
    return out


def problems(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    found = []
    for name, was in recorded.items():
        now = current.get(name)
        if now is None or now == "missing":
            found.append(f"{name} disappeared (was {was})")
        elif now != was:
            found.append(f"{name} changed: {was} -> {now}")
    for name in current.keys() - recorded.keys():
        found.append(f"{name} is used by the guide or the example but not recorded ({current[name]})")
    return sorted(found)


def test_the_guides_names_keep_their_signatures() -> None:
    current = surface()
    if os.environ.get("AFTERWORD_API_SURFACE") == "write":
        SNAPSHOT.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"wrote {len(current)} names to {SNAPSHOT.name}")
    recorded = json.loads(SNAPSHOT.read_text())
    assert problems(recorded, current) == []
    # the surface is more than a handful of names: the guide's whole working set
    assert {"afterword.store.RecordStore.transact", "afterword.store.Collection.update"} <= current.keys()


def test_instance_attributes_exist_on_an_open_store(state_dir: str) -> None:
    from afterword.store import RecordStore

    with RecordStore.open(state_dir) as store:
        for attr in INSTANCE_ATTRIBUTES["afterword.store.RecordStore"]:
            assert getattr(store, attr) is not None


def test_a_removed_or_changed_name_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import afterword.store
    from afterword.store import RecordStore

    recorded = json.loads(SNAPSHOT.read_text())

    async def transact(self: RecordStore, mutations: list[object]) -> int:  # lost ``expect``
        raise NotImplementedError

    monkeypatch.setattr(RecordStore, "transact", transact)
    monkeypatch.delattr(afterword.store, "open_readonly")
    found = problems(recorded, surface())
    assert any(p.startswith("afterword.store.RecordStore.transact changed") for p in found), found
    assert any(p.startswith("afterword.store.open_readonly disappeared") for p in found), found

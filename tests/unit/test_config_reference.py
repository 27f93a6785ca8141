"""docs/configuration.md documents every key the loader accepts.

The accepted keys are read from the loader's own input Structs (they forbid unknown keys, so
they are exactly what is accepted); a key added there without a row in the reference fails.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest

from afterword.config import mcp as mcp_loader
from afterword.config import raw

DOC = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()

# Fields typed ``dict[str, Any]`` or ``list[...]`` whose values are converted entry by entry:
# the element type the loader uses, and how the reference writes the element's path.
ELEMENTS: dict[str, tuple[Any, str]] = {
    "continuations.namedRoutes": (raw.RawNamedRoute, "continuations.namedRoutes.<name>"),
    "continuations.detachedServices": (raw.RawDetachedService, "continuations.detachedServices[]"),
    "continuations.channels": (raw.RawChannel, "continuations.channels.<key>"),
}
LEAF_MAPS = {"continuations.channels.<key>.headers"}  # free-form string maps


def _structs(tp: Any) -> list[type[msgspec.Struct]]:
    return [t for t in (get_args(tp) or (tp,)) if isinstance(t, type) and issubclass(t, msgspec.Struct)]


def accepted_keys(struct: type[msgspec.Struct], prefix: str) -> set[str]:
    keys: set[str] = set()
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    if info.tag_field:
        keys.add(f"{prefix}.{info.tag_field}")
    for field in msgspec.structs.fields(struct):
        path = f"{prefix}.{field.encode_name}" if prefix else field.encode_name
        keys.add(path)
        if path in ELEMENTS:
            element, element_path = ELEMENTS[path]
            for sub in _structs(element):
                keys |= accepted_keys(sub, element_path)
            continue
        nested = _structs(field.type)
        if nested:
            for sub in nested:
                keys |= accepted_keys(sub, path)
        else:
            origin = getattr(field.type, "__origin__", None)
            assert origin not in (dict, list) or path in LEAF_MAPS or "Servers" in path, (
                f"{path}: a new map or list key; teach this test how its entries are shaped"
            )
    return keys


def test_every_accepted_config_key_is_in_the_reference() -> None:
    keys = accepted_keys(raw.RawConfig, "")
    keys |= accepted_keys(mcp_loader._RawEntry, "mcpServers.<name>")
    assert "continuations.limits.maxActiveRecords" in keys  # the walk reaches nested blocks
    assert "continuations.channels.<key>.tokenEnv" in keys  # ...and tagged adapter unions
    documented = set(re.findall(r"`([A-Za-z<>\[\]._*]+)`", DOC))
    missing = sorted(k for k in keys if k not in documented)
    assert not missing, f"docs/configuration.md does not document: {missing}"


@pytest.mark.parametrize(
    ("section", "default"),
    [
        ("continuations.limits.maxActiveRecords", "10000"),
        ("continuations.limits.operatorPageSize", "100"),
        ("continuations.retention.capturedTextMaxAgeMs", "2592000000"),
        ("continuations.port", "4319"),
    ],
)
def test_documented_defaults_match_the_loader(section: str, default: str) -> None:
    row = next(line for line in DOC.splitlines() if line.startswith(f"| `{section}` "))
    assert f"`{default}`" in row
    from afterword.config import default_config

    config = default_config("/tmp")
    name = section.rsplit(".", 1)[1]
    snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)
    holder = (
        config.limits if ".limits." in section else config.retention if ".retention." in section else config
    )
    assert str(getattr(holder, snake)) == default

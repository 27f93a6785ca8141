"""The module paths issue 16 moved still import, and say so where they are deprecated.

Each old path is imported afresh (dropped from ``sys.modules`` first) so its warning is
observed even when another test imported it earlier.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import subprocess
import sys
import warnings
from types import ModuleType

import pytest

import afterword

# old path -> (new path, names that must be the very same objects under both)
DEPRECATED = {
    "afterword.wire": ("afterword.protocol.wire", ["ClaimRequest", "StatusBody", "ErrorBody"]),
    "afterword.views": ("afterword.protocol.views", ["status_body", "detail_body", "list_item"]),
    "afterword.operator": ("afterword.clients.operator", ["OperatorClient", "OperatorError", "read_operator_token"]),
    "afterword.metrics": ("afterword.http.metrics", ["render_metrics", "ServiceCollector"]),
    "afterword.serve": ("afterword.cli.serve", ["serve", "JsonLineFormatter"]),
    "afterword.demo": ("afterword.cli.demo", ["run_demo"]),
    "afterword.doctor": ("afterword.cli.doctor", ["diagnose", "render"]),
    "afterword.tasks.cli": ("afterword.cli.tasks", ["add_tasks_parser", "JournalUnavailable"]),
    "afterword.service": ("afterword.app.service", ["ContinuationService", "Resolution", "wall_clock_ms"]),
    "afterword.repository": ("afterword.app.repository", ["Repository", "IndexCorrupt", "LIVE", "TOMB"]),
    "afterword.runtime": ("afterword.app.runtime", ["open_service"]),
    "afterword.host": ("afterword.app.binding", ["RunBinding", "IssuedCapability", "RESERVED_ENV"]),
    "afterword.host.binding": ("afterword.app.binding", ["RunBinding", "RESERVED_HEADERS", "strip_reserved_env"]),
}
# Public entry points named in docs/design.md: stable aliases, no warning.
STABLE = {
    "afterword.producer": "afterword.clients.producer",
    "afterword.mcp_host": "afterword.clients.mcp_host",
}


def _fresh_import(name: str) -> ModuleType:
    with warnings.catch_warnings():  # a parent that is itself a shim warns here, not below
        warnings.simplefilter("ignore")
        importlib.import_module(name.rpartition(".")[0])
    sys.modules.pop(name, None)
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(DEPRECATED))
def test_deprecated_path_warns_and_reexports(old: str) -> None:
    new, names = DEPRECATED[old]
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}")):
        shim = _fresh_import(old)
    target = importlib.import_module(new)
    for name in names:
        assert getattr(shim, name) is getattr(target, name), name


@pytest.mark.parametrize("old", sorted(STABLE))
def test_public_alias_imports_without_warning(old: str) -> None:
    new = STABLE[old]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alias = _fresh_import(old)
    target = importlib.import_module(new)
    assert alias.__all__ == target.__all__
    for name in target.__all__:
        assert getattr(alias, name) is getattr(target, name), name


def test_old_tasks_entry_still_runs() -> None:
    # ``python -m afterword.tasks.cli tasks ...`` was the documented stand-alone entry.
    done = subprocess.run(
        [sys.executable, "-m", "afterword.tasks.cli", "tasks", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: afterword tasks" in done.stdout


def test_no_module_in_the_package_imports_a_moved_path() -> None:
    # The shims are for users; the package itself uses the new homes, so deleting the shims
    # next release breaks nothing inside it.
    root = pathlib.Path(afterword.__file__).parent
    old_paths = [*DEPRECATED, *STABLE]
    shim_files = {root / (p.removeprefix("afterword.").replace(".", "/") + ".py") for p in old_paths}
    offenders = []
    for path in root.rglob("*.py"):
        if path in shim_files:
            continue
        package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
        for match in re.finditer(r"^\s*from (\.+)([\w.]*) import ([\w, ]+)", path.read_text(), re.M):
            dots, rest, names = match.groups()
            base = package.rsplit(".", len(dots) - 1)[0] if len(dots) > 1 else package
            modules = [f"{base}.{rest}"] if rest else [f"{base}.{n.strip()}" for n in names.split(",")]
            offenders += [f"{path.relative_to(root)}: {m}" for m in modules if m in old_paths]
        for match in re.finditer(r"^\s*(?:from|import) (afterword[\w.]*)", path.read_text(), re.M):
            if match.group(1) in old_paths:
                offenders.append(f"{path.relative_to(root)}: {match.group(1)}")
    assert offenders == []


@pytest.mark.parametrize("old", ["afterword.host", "afterword.host.binding"])
def test_the_issued_capability_keeps_its_old_name_at_the_old_path(old: str) -> None:
    # The service's record was ClaimCapability, like the producer's public class; only the old
    # module paths keep that name for it.
    from afterword.app.binding import IssuedCapability
    from afterword.producer import ClaimCapability

    with pytest.warns(DeprecationWarning):
        shim = _fresh_import(old)
    assert shim.ClaimCapability is IssuedCapability
    assert IssuedCapability is not ClaimCapability


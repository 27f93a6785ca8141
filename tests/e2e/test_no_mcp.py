"""The core runs without the MCP SDK; MCP support is the ``afterword[mcp]`` extra.

Each subprocess runs with a meta-path finder in front that refuses ``mcp`` (and the 2.x line's
``mcp_types``/``httpx2``, and ``fastmcp``) and records every attempt, so the tests see both
that nothing needed the SDK and that nothing quietly tried it and fell back.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import httpx
import pytest
from _service import ENV, write_config

from afterword.clients import mcp_sdk
from afterword.clients.mcp_sdk import McpSdkUnavailable, installed_line

ROOT = Path(__file__).resolve().parents[2]
ATTEMPT = "MCP IMPORT ATTEMPTED:"
BLOCKER = f"""
import atexit, sys
_tried = []
class _NoMcp:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {{"mcp", "mcp_types", "httpx2", "fastmcp"}}:
            _tried.append(name)
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _NoMcp())
atexit.register(lambda: _tried and print("{ATTEMPT} " + ", ".join(_tried), file=sys.stderr))
"""
CLI = (
    BLOCKER
    + """
import runpy
sys.argv = ["afterword", *sys.argv[1:]]
runpy.run_module("afterword.cli", run_name="__main__", alter_sys=True)
"""
)


def without_mcp(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **ENV})


@contextmanager
def serving_without_mcp(config: Path) -> Iterator[subprocess.Popen[str]]:
    base = f"http://127.0.0.1:{json.loads(config.read_text())['continuations']['port']}"
    proc = subprocess.Popen(
        without_mcp(CLI, "serve", "--config", str(config)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **ENV},
    )
    try:
        end = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            try:
                httpx.get(base + "/v1/operator/health", timeout=2, trust_env=False)
                break
            except httpx.HTTPError:
                assert time.monotonic() < end, "serve did not start"
                time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)


def test_serve_and_the_operator_cli_run_without_the_mcp_sdk(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with serving_without_mcp(config) as proc:
        health = run(without_mcp(CLI, "continuations", "health", "--config", str(config)))
        assert health.returncode == 0, health.stderr
        assert "healthy" in health.stdout
        assert ATTEMPT not in health.stderr
        listed = run(without_mcp(CLI, "continuations", "list", "--json", "--config", str(config)))
        assert listed.returncode == 0, listed.stderr
        assert ATTEMPT not in listed.stderr
    stderr = proc.stderr.read() if proc.stderr else ""
    assert ATTEMPT not in stderr and "Traceback" not in stderr, stderr[-2000:]


def test_the_producer_and_the_service_import_without_the_mcp_sdk() -> None:
    code = BLOCKER + "import afterword, afterword.producer, afterword.runtime, afterword.cli.main\n"
    done = run(without_mcp(code))
    assert done.returncode == 0, done.stderr
    assert ATTEMPT not in done.stderr


def test_the_demo_without_the_mcp_sdk_says_which_extra_to_install() -> None:
    done = run(without_mcp(CLI, "demo"))
    assert done.returncode == 2
    assert "pip install 'afterword[mcp]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_importing_the_host_helpers_without_the_sdk_is_an_import_error_naming_the_extra() -> None:
    code = BLOCKER + (
        "from afterword.clients.mcp_sdk import McpSdkUnavailable\n"
        "try:\n    import afterword.mcp_host\nexcept ImportError as exc:\n"
        "    assert isinstance(exc, McpSdkUnavailable), type(exc)\n    print(exc)\n"
    )
    done = run(without_mcp(code))
    assert done.returncode == 0, done.stderr
    assert "afterword[mcp]" in done.stdout


@pytest.mark.parametrize(("installed", "line"), [("2.3.0", 2), ("2.0.0rc1", 2), ("1.30.0", 1), ("1.24.0", 1)])
def test_the_adapter_follows_the_installed_line(
    monkeypatch: pytest.MonkeyPatch, installed: str, line: int
) -> None:
    monkeypatch.setattr(mcp_sdk, "version", lambda _name: installed)
    assert installed_line() == line


@pytest.mark.parametrize("installed", ["1.23.4", "0.9.0", "3.0.0", "garbage"])
def test_an_sdk_line_outside_the_range_is_refused(monkeypatch: pytest.MonkeyPatch, installed: str) -> None:
    monkeypatch.setattr(mcp_sdk, "version", lambda _name: installed)
    with pytest.raises(McpSdkUnavailable, match=r"(?i)mcp sdk"):
        installed_line()


def test_a_missing_sdk_is_refused_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(mcp_sdk, "version", missing)
    with pytest.raises(McpSdkUnavailable, match=r"afterword\[mcp\]"):
        installed_line()


def test_the_core_dependencies_name_no_mcp_and_the_extra_admits_both_lines() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.replace("_", "-").startswith(("mcp", "fastmcp"))]
    extras = project["optional-dependencies"]
    assert extras["mcp"] == ["mcp>=1.24,<3"]
    assert "mcp>=1.24,<3" in extras["examples"]
    assert "mcp>=2.3,<3" in extras["test"]  # the default test venv runs on the 2.x line


def _sdk_imports(tree: ast.Module) -> list[str]:
    """Imports of the MCP SDK (or its 2.x HTTP stack) that run when the module is imported:
    anything outside an ``if TYPE_CHECKING:`` block."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found.extend(n for n in names if n.partition(".")[0] in {"mcp", "mcp_types", "httpx2", "fastmcp"})
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_only_the_sdk_adapters_import_the_mcp_sdk() -> None:
    # The host helpers' two lines, and the service's task follower (SDK 2.x only, imported by
    # worker/taskfollow.load_wire when a loopback HTTP continuation server is configured).
    adapters = {
        "afterword/clients/_mcp_v1.py",
        "afterword/clients/_mcp_v2.py",
        "afterword/worker/taskwire.py",
    }
    importing = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "afterword").rglob("*.py")
        if _sdk_imports(ast.parse(path.read_text(), str(path)))
    }
    assert importing == adapters

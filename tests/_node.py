"""Node and the TypeScript client for the tests that run them: the toolchain (skipped without
it, a failure under ``CI=true``) and one compile of ``clients/typescript`` per source state.

The compile is shared: the tests that import ``dist/`` run in several modules and, under
pytest-xdist, in several worker processes at once. A file lock serializes it, and a digest of
the sources written under node_modules lets every later caller reuse it instead of rewriting
files another process may be reading.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TS = ROOT / "clients" / "typescript"
NODE_HOST = ROOT / "examples" / "node-host"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is required in CI (Node 20 with npm)")
        pytest.skip(f"{name} is not installed")
    return path


def npm_ci(folder: Path) -> None:
    if not (folder / "node_modules").is_dir():
        subprocess.run(
            [tool("npm"), "ci", "--no-audit", "--no-fund", "--silent"], cwd=folder, check=True, timeout=300
        )


def _source_digest() -> str:
    digest = hashlib.sha256()
    inputs = [TS / "tsconfig.json", TS / "package.json", TS / "package-lock.json"]
    inputs += sorted(p for folder in ("src", "test") for p in (TS / folder).rglob("*") if p.is_file())
    for path in inputs:
        digest.update(str(path.relative_to(TS)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def built_node() -> str:
    """The node binary, with ``clients/typescript/dist`` compiled from the current sources."""
    node = tool("node")
    tool("npm")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    assert int(version.lstrip("v").split(".")[0]) >= 20, version
    npm_ci(TS)
    stamp = TS / "node_modules" / ".afterword-dist-digest"  # kept out of dist/, which npm packs
    with open(TS / "node_modules" / ".afterword-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        digest = _source_digest()
        built = (TS / "dist" / "src" / "index.js").is_file()
        if not built or not stamp.is_file() or stamp.read_text() != digest:
            subprocess.run(
                [node, str(TS / "node_modules/typescript/bin/tsc"), "-p", str(TS)], check=True, timeout=300
            )
            stamp.write_text(digest)
    return node

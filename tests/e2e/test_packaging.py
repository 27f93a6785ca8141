"""The built wheel: typed, carries the examples the demo runs, declares the examples' extra,
and needs the MCP SDK only through the ``mcp`` extra; and (with AFTERWORD_WHEEL_TEST=1, as
.ci/run does after the suite) installs into a fresh virtualenv, not editable, without pulling
an MCP SDK, then beside a user's SDK 2.x (left as it is) where `afterword demo` runs to a
delivered answer."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import afterword.http.ui

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(out: Path) -> Path:
    # The build writes build/ and *.egg-info in the checkout: one build at a time (pytest-xdist
    # runs this file's two tests in two processes).
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / ".afterword-test-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [wheel] = out.glob("afterword-*.whl")
    return wheel


@pytest.mark.timeout(300)
def test_wheel_is_typed_and_carries_the_examples(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert "afterword/py.typed" in names
    assert "afterword/http/openapi.json" in names  # the shipped OpenAPI document
    ui = Path(afterword.http.ui.__file__).parent  # the status page's templates and static files
    shipped = {
        f"afterword/http/ui/{p.relative_to(ui)}"
        for p in ui.rglob("*")
        if p.suffix in (".html", ".css", ".js", ".svg")
    }
    assert shipped and shipped <= names, shipped - names
    examples = (
        "work_control_server.py",
        "fastmcp_server.py",
        "tasks_server.py",
        "reference_host.py",
        "embed.py",
        "walkthrough.sh",
    )
    for example in (*examples, "mcp.json"):
        assert f"afterword/examples/{example}" in names
    assert "afterword/__main__.py" in names and "afterword/cli/tasks.py" in names
    assert "Provides-Extra: examples" in metadata
    # The MCP SDK only through an extra, whose range admits both SDK lines.
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: mcp")]
    assert requires and all("extra ==" in line for line in requires), requires
    assert 'Requires-Dist: mcp<3,>=1.24; extra == "mcp"' in requires, requires
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


@pytest.mark.timeout(900)
@pytest.mark.skipif(os.environ.get("AFTERWORD_WHEEL_TEST") != "1", reason="set AFTERWORD_WHEEL_TEST=1 (slow)")
def test_wheel_installs_into_a_fresh_venv_and_runs_the_demo(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")

    def pip(*args: str) -> None:
        done = subprocess.run(
            [python, "-m", "pip", "install", "-q", *args], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]

    def mcp_version() -> str:
        probe = "import importlib.metadata as m\ntry:\n    print(m.version('mcp'))\nexcept m.PackageNotFoundError:\n    print('none')"
        return subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.strip()

    work = tmp_path / "fresh"
    work.mkdir()
    # Run from an empty directory with only the venv on PATH: nothing can come from this checkout.
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}

    # A plain install pulls no MCP SDK; the demo then says which extra to install.
    pip(str(wheel))
    assert mcp_version() == "none"
    bare = subprocess.run(
        [str(venv / "bin" / "afterword"), "demo"], capture_output=True, text=True, cwd=work, env=env
    )
    assert bare.returncode == 2 and "afterword[mcp]" in bare.stderr, bare.stderr

    # A user already on SDK 2.x adds the extra: the SDK stays where it was.
    pip("mcp>=2.3,<3")
    before = mcp_version()
    pip(f"{wheel}[mcp]")
    assert mcp_version() == before and before.startswith("2."), before
    demo = subprocess.run(
        [str(venv / "bin" / "afterword"), "demo"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=work,
        env=env,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "Health: healthy" in demo.stdout
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import afterword; print(afterword.__file__)"],
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
    )
    assert where.stdout.startswith(str(venv))

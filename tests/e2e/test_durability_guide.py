"""docs/durability-layer.md: every code block in the guide runs.

Each ``python`` block is a self-contained program; it is executed as ``__main__`` from the
repository root (as a reader would run it) and must finish without an exception (its own
asserts check what it claims). Each ``sh`` command is either run here or, when another test
already runs that exact command (with its checks), matched against that test's constant.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/, bench/ and tools/ are top-level folders, not installed
    sys.path.insert(0, str(ROOT))

import test_bench_jobqueue  # noqa: E402
import test_jobqueue_crash  # noqa: E402

GUIDE = ROOT / "docs" / "durability-layer.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
BLOCKS = [(lang, body) for lang, body in FENCE.findall(GUIDE.read_text()) if lang in ("python", "sh")]
PYTHON = [body for lang, body in BLOCKS if lang == "python"]
COMMANDS = [line for lang, body in BLOCKS if lang == "sh" for line in body.splitlines() if line.strip()]
# Commands that a dedicated test runs exactly (and checks more closely than "it exits 0").
COVERED = {
    test_jobqueue_crash.GUIDE_COMMAND: "tests/e2e/test_jobqueue_crash.py",
    test_bench_jobqueue.GUIDE_COMMAND: "tests/e2e/test_bench_jobqueue.py",
}


def test_the_guide_has_the_blocks_it_promises() -> None:
    assert len(PYTHON) >= 10
    assert not [lang for lang, _ in FENCE.findall(GUIDE.read_text()) if lang not in ("python", "sh")]
    assert set(COVERED) <= set(COMMANDS)


@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_python_block_runs(
    index: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    code = compile(PYTHON[index], f"{GUIDE.name} python block {index + 1}", "exec")
    exec(code, {"__name__": "__main__"})
    # A block shows a refusal by catching it and printing "refused: ..." (or "failed: ...");
    # each such print must have run, so an example cannot pass by not raising.
    shown = len(re.findall(r'print\(f?"(?:refused|failed)', PYTHON[index]))
    printed = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith(("refused", "failed"))
    ]
    assert len(printed) >= shown, printed


@pytest.mark.parametrize("command", COMMANDS)
def test_sh_command_runs(command: str) -> None:
    if command in COVERED:
        return  # run, with its checks, by COVERED[command]
    argv = shlex.split(command)
    argv[0] = sys.executable if argv[0] == "python" else argv[0]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr

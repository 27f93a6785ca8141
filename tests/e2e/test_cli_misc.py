"""Small CLI contracts: a disabled service does not start; `afterword tasks` is wired in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "afterword.cli"]


def test_serve_refuses_when_continuations_are_disabled(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    config = tmp_path / "afterword.json"
    config.write_text(json.dumps({"continuations": {"enabled": False}}))
    done = subprocess.run(
        [*CLI, "serve", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "disabled" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / ".mono-agent").exists()  # nothing was opened or created


def test_tasks_subcommand_is_wired_into_afterword(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    (tmp_path / "none").mkdir(mode=0o700)  # an empty state directory: an empty journal
    done = subprocess.run(
        [*CLI, "tasks", "list", "--state-dir", str(tmp_path / "none"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"items": []}
    missing = subprocess.run(
        [*CLI, "tasks", "show", "t-nope", "--state-dir", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1
    absent = subprocess.run(
        [*CLI, "tasks", "list", "--state-dir", str(tmp_path / "absent")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert absent.returncode == 3 and "does not exist" in absent.stderr


def test_the_command_line_does_not_import_what_only_some_commands_use() -> None:
    """Start-up time: every `afterword` command imports the CLI. httpx (the operator verbs'
    client), the legacy migration (serve only) and webbrowser (`ui --open` only) load when a
    command needs them, not on import."""
    probe = (
        "import sys, afterword.cli.main; "
        "print(sorted(m for m in ('httpx', 'afterword.legacy', 'webbrowser') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

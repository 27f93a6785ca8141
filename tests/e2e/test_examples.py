"""The shipped examples run as a newcomer would run them, against real processes.

- examples/walkthrough.sh (curl) against a real `afterword serve` using examples/afterword.json;
- examples/embed.py as is;
- examples/reference_host.py with a relative --config from another directory, so the MCP
  server's relative args must resolve beside the MCP config, not the current directory.

Each copies the examples to a temporary directory first, so no state is left in examples/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from _service import free_port

pytestmark = pytest.mark.timeout(180)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOKEN = "walkthrough-token-0123456789abcdef"


def copy_examples(root: Path) -> tuple[Path, int]:
    target = root / "examples"
    shutil.copytree(
        EXAMPLES, target, ignore=shutil.ignore_patterns(".mono-agent", "outbox.jsonl", "__pycache__")
    )
    port = free_port()
    config = target / "afterword.json"
    doc = json.loads(config.read_text())
    doc["continuations"]["port"] = port
    config.write_text(json.dumps(doc))
    return target, port


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORK_CONTROL_")}
    # The walkthrough runs `afterword payload-hash`: the one installed beside this interpreter.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env.update(extra)
    return env


@pytest.mark.skipif(shutil.which("curl") is None, reason="the walkthrough is a curl script")
def test_walkthrough_script_runs_against_a_real_serve(tmp_path: Path) -> None:
    folder, port = copy_examples(tmp_path)
    env = child_env(WORK_CONTROL_CONTINUATION_TOKEN=TOKEN)
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - handed to the child
    serve = subprocess.Popen(
        [sys.executable, "-m", "afterword", "serve", "--config", str(folder / "afterword.json")],
        stdout=log,
        stderr=log,
        env=env,
    )
    try:
        end = time.monotonic() + 30
        while True:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/livez").status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < end, "serve did not start"
                time.sleep(0.05)
        done = subprocess.run(
            ["bash", str(EXAMPLES / "walkthrough.sh")],
            capture_output=True,
            text=True,
            timeout=90,
            env={**env, "AFTERWORD_URL": f"http://127.0.0.1:{port}"},
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "is delivered" in done.stdout
        cid = done.stdout.rsplit("walkthrough: ", 1)[1].split()[0]
        shown = subprocess.run(
            [
                sys.executable,
                "-m",
                "afterword",
                "continuations",
                "show",
                cid,
                "--config",
                str(folder / "afterword.json"),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert shown.returncode == 0 and "posted" in shown.stdout
        # Without the token the script stops at once and says what to set.
        missing = subprocess.run(
            ["bash", str(EXAMPLES / "walkthrough.sh")],
            capture_output=True,
            text=True,
            timeout=30,
            env=child_env(),
        )
        assert missing.returncode == 2 and "WORK_CONTROL_CONTINUATION_TOKEN" in missing.stderr
    finally:
        serve.terminate()
        assert serve.wait(timeout=30) == 0
    [line] = [json.loads(x) for x in (folder / "outbox.jsonl").read_text().splitlines()]
    assert line["conversationId"] == "slack:C_EXAMPLE:T_EXAMPLE"
    assert line["text"] == "From a background service: 3 invoices need approval"


def test_embedding_example_runs_and_leaves_nothing_behind(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "embed.py"), "--reply-to", "local:embed-test"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
        env=child_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5. delivered to local:embed-test via" in done.stdout
    assert "the index has 42,017 documents" in done.stdout
    assert "health: healthy" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_reference_host_runs_from_another_directory_without_the_detached_token(tmp_path: Path) -> None:
    copy_examples(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "reference_host.py"), "--config", "../examples/afterword.json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=elsewhere,
        env=child_env(),  # no WORK_CONTROL_CONTINUATION_TOKEN: this host makes no detached claims
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "[later answer -> local:chat-1]" in done.stdout
    assert list(elsewhere.iterdir()) == []


def test_reference_host_starts_the_example_server_with_its_own_interpreter_not_path_python3(
    tmp_path: Path,
) -> None:
    # A venv that is not activated: python/python3 on PATH is another interpreter, here one that
    # cannot import afterword (a shim that fails), so the example server must not be run by it.
    copy_examples(tmp_path)
    shims = tmp_path / "shims"
    shims.mkdir()
    for name in ("python", "python3"):
        shim = shims / name
        shim.write_text("#!/bin/sh\necho 'shim python: no afterword here' >&2\nexit 3\n")
        shim.chmod(0o755)
    env = child_env()
    env["PATH"] = os.pathsep.join([str(shims), os.environ.get("PATH", "")])
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "reference_host.py"),
            "--config",
            str(tmp_path / "examples" / "afterword.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"command 'python3' runs as this host's interpreter {sys.executable}" in done.stdout
    assert "[later answer -> local:chat-1]" in done.stdout
    # --path-python asks for the PATH lookup, and gets the shim.
    kept = subprocess.run([*done.args, "--path-python"], capture_output=True, text=True, timeout=120, env=env)
    assert kept.returncode != 0 and "shim python: no afterword here" in kept.stderr


def test_running_examples_in_place_leaves_nothing_for_git(tmp_path: Path) -> None:
    root = EXAMPLES.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["examples/.mono-agent/continuations/secret", "examples/outbox.jsonl"]
    done = subprocess.run(["git", "check-ignore", *paths], cwd=root, capture_output=True, text=True)
    assert done.stdout.split() == paths


def test_readme_embedding_snippet_is_taken_from_embed_py() -> None:
    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme.split("## Embedding (the app handle)", 1)[1]
    snippet = section.split("```python", 1)[1].split("```", 1)[0]
    source = {line.split("  #", 1)[0].strip() for line in (EXAMPLES / "embed.py").read_text().splitlines()}
    lines = [line.split("  #", 1)[0].strip() for line in snippet.splitlines()]
    missing = [line for line in lines if line and line not in source]
    assert not missing, f"README shows lines that examples/embed.py does not have: {missing}"


def test_files_the_readme_writes_in_the_clone_are_ignored() -> None:
    """Every file README.md's commands write into the clone's root (a redirect, `--file`,
    `--token-file`) is git-ignored, so following the README leaves `git status` clean."""
    root = EXAMPLES.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    readme = (root / "README.md").read_text()
    written = set(re.findall(r"(?:2>|--file |--token-file )([\w.-]+)", readme))
    written |= {".mono-agent/continuations/secret", "outbox.jsonl"}  # a bare `afterword serve`
    assert {"host.token", "serve.log"} <= written  # the pattern really finds the README's files
    done = subprocess.run(["git", "check-ignore", *sorted(written)], cwd=root, capture_output=True, text=True)
    assert sorted(done.stdout.split()) == sorted(written)

"""A config file that cannot be used is named in one line, without the JSON-path root ``$``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from _cli import CLI, env

from afterword.cli.main import main


def test_missing_config_file_is_named_without_the_root_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "afterword.json"
    assert main(["continuations", "list", "--config", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("afterword: cannot read config file ") and str(missing) in err
    assert "$" not in err and len(err.splitlines()) == 1


def test_a_config_that_is_not_an_object_names_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "afterword.json"
    config.write_text("[]", encoding="utf-8")
    assert main(["continuations", "list", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"afterword: {config}: expected a JSON object")
    assert "$" not in err


def test_a_bad_value_still_names_its_json_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "afterword.json"
    config.write_text('{"continuations": {"port": 0}}', encoding="utf-8")
    assert main(["continuations", "list", "--config", str(config)]) == 2
    assert capsys.readouterr().err.startswith("afterword: continuations.port: ")


@pytest.mark.parametrize(
    ("document", "path", "suggestion"),
    [
        ({"continuations": {"prot": 4320}}, "continuations.prot", "port"),
        (
            {"continuations": {"limits": {"runLeaseMS": 5000}}},
            "continuations.limits.runLeaseMS",
            "runLeaseMs",
        ),
        (
            {"continuations": {"namedRoutes": {"r": {"conversationID": "x"}}}},
            "continuations.namedRoutes.r.conversationID",
            "conversationId",
        ),
        ({"tools": {"continuationServer": []}}, "tools.continuationServer", "continuationServers"),
    ],
)
def test_an_unknown_key_close_to_a_known_one_gets_a_did_you_mean(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    document: dict[str, object],
    path: str,
    suggestion: str,
) -> None:
    config = tmp_path / "afterword.json"
    config.write_text(json.dumps(document), encoding="utf-8")
    assert main(["continuations", "list", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"afterword: {path}: unknown key (did you mean '{suggestion}'?)")
    assert len(err.splitlines()) == 1


def test_an_unknown_key_like_no_known_one_gets_no_guess(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "afterword.json"
    config.write_text('{"continuations": {"zzzzzz": 1}}', encoding="utf-8")
    assert main(["continuations", "list", "--config", str(config)]) == 2
    assert capsys.readouterr().err.startswith("afterword: continuations.zzzzzz: unknown key (see ")


@pytest.mark.parametrize("state_dir", ["afile/state", "afile"])
@pytest.mark.parametrize("verb", [["serve"], ["continuations", "doctor"], ["continuations", "list"]])
def test_a_state_dir_inside_a_regular_file_is_one_line_not_a_traceback(
    tmp_path: Path, state_dir: str, verb: list[str]
) -> None:
    (tmp_path / "afile").write_text("not a directory\n", encoding="utf-8")
    config = tmp_path / "afterword.json"
    config.write_text(json.dumps({"continuations": {"port": 4399, "stateDir": state_dir}}), encoding="utf-8")
    done = subprocess.run(
        [*CLI, *verb, "--config", str(config)], capture_output=True, text=True, timeout=60, env=env()
    )
    assert done.returncode == 2
    assert done.stderr.startswith("afterword: continuations.stateDir: ") and "is a file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_serve_refusing_a_loose_state_dir_says_the_fix_doctor_knows(tmp_path: Path) -> None:
    from afterword.cli.doctor import fix_for

    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # whatever the umask
    config = tmp_path / "afterword.json"
    config.write_text(json.dumps({"continuations": {"port": 4399, "stateDir": "state"}}), encoding="utf-8")
    done = subprocess.run(
        [*CLI, "serve", "--config", str(config)], capture_output=True, text=True, timeout=60, env=env()
    )
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    fix = fix_for("permissive_mode")
    assert fix is not None and "chmod 0700" in fix
    assert "permissive_mode (mode 0755)" in done.stderr and f"to fix: {fix}" in done.stderr
    assert "afterword continuations doctor" in done.stderr

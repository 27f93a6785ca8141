"""A config file that cannot be used is named in one line, without the JSON-path root ``$``."""

from __future__ import annotations

from pathlib import Path

import pytest

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

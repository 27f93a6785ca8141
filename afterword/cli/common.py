"""What every ``afterword`` command shares: the usage error, ``--config`` resolution, and the
one-error-per-command output (a line on stderr, or a JSON document with ``--json``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import msgspec

from ..clients.operator import OperatorClient, read_operator_token
from ..config import Config, default_config, load_config
from ..disk import DiskError
from ..errors import AfterwordError

CONFIG_HELP = (
    "the afterword.json the service runs with (default: ./afterword.json if present, else the "
    "built-in defaults: 127.0.0.1:4319, state in ./.mono-agent/continuations)"
)
# `continuations health` (and every operator verb) when the service cannot be reached.
EXIT_UNREACHABLE = 3
JSON_HELP = 'print JSON on stdout (errors too, as {"error": {"code", "message"}})'


class CliError(AfterwordError):
    def __init__(self, message: str, code: int = 1, kind: str = "usage") -> None:
        self.code = code
        self.kind = kind
        super().__init__(message)


def resolve_config(path: str | None, *, check_secrets: bool = True) -> Config:
    """``--config PATH``; else ./afterword.json if present; else the documented defaults."""
    if path is not None:
        return load_config(path, check_secrets=check_secrets)
    if Path("afterword.json").is_file():
        return load_config("afterword.json", check_secrets=check_secrets)
    return default_config(os.getcwd())


def print_json(obj: object) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode() + "\n")


def report(args: argparse.Namespace, code: str, message: str, exit_code: int) -> int:
    """One error: a JSON document on stdout with ``--json``, else one line on stderr."""
    if getattr(args, "json", False):
        sys.stdout.write(msgspec.json.encode({"error": {"code": code, "message": message}}).decode() + "\n")
    else:
        print(f"afterword: {message}", file=sys.stderr)
    return exit_code


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are JSON too when the command line asks for ``--json``."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if Parser.json_errors:
            error = {"error": {"code": "usage", "message": f"{self.prog}: {message} (see {self.prog} -h)"}}
            sys.stdout.write(msgspec.json.encode(error).decode() + "\n")
            sys.exit(2)
        super().error(message)


def operator_client(args: argparse.Namespace) -> tuple[Config, OperatorClient]:
    """The ``--config`` in ``args`` and a client holding the operator capability derived from
    that configuration's state secret (so only the state directory's owner gets one)."""
    config = resolve_config(args.config, check_secrets=False)
    return config, OperatorClient(config, derive_capability(config, read_operator_token))


def derive_capability(config: Config, read: Callable[[Config], str]) -> str:
    if not os.path.isdir(config.state_dir):
        raise CliError(
            f"no service state at {config.state_dir}: pass --config with the afterword.json the "
            "service runs with, or start `afterword serve` first",
            EXIT_UNREACHABLE,
            "no_state",
        )
    try:
        return read(config)
    except (DiskError, OSError) as exc:
        raise CliError(
            f"cannot derive the operator capability from {config.state_dir}: {exc} (run the CLI as the "
            "user that owns the service's state directory)",
            1,
            "state_dir",
        ) from None

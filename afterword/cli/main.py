"""The ``afterword`` command: argument parsing and dispatch for ``serve``, ``continuations``,
``tasks`` and ``demo``.

Thin: parse arguments, call the service or the operator client, print, exit. Errors are one
line on stderr with a non-zero exit code and say what to do next; with ``--json`` they are one
``{"error": {"code", "message"}}`` document on stdout instead. No traceback, no secret.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from .. import __version__
from ..clients.operator import OperatorError
from ..config import ConfigError
from ..disk import DiskError
from ..errors import StateError
from ..store import StoreError, StoreLockedError
from ..wal import WalError
from .common import CONFIG_HELP, EXIT_UNREACHABLE, CliError, Parser, report, resolve_config
from .continuations import add_continuations_parser, operator_message
from .payloadhash import add_payload_hash_parser
from .tasks import add_tasks_parser


def cmd_serve(args: argparse.Namespace) -> int:
    import anyio

    from .serve import serve

    config = resolve_config(args.config)
    if not config.enabled:
        raise CliError("continuations are disabled in this configuration (continuations.enabled is false)", 2)
    # `python -m afterword` restores SIGPIPE's default action so a verb piped into `head` ends
    # quietly. A server must not: a write to a socket its peer already closed (a client gone, a
    # Tasks server that dropped the connection the follower polls on) would kill the process
    # instead of raising an error for that one connection. The kill test found it.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    return anyio.run(serve, config, args.outbox)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="afterword",
        description="Durable continuations for AI agent hosts: a tool server finishes work after "
        "its call returned, and afterword delivers one later answer to the right conversation.",
        epilog="Start with `afterword demo`. Configuration reference: docs/configuration.md.",
    )
    parser.add_argument("--version", action="version", version=f"afterword {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the HTTP service and the worker loop in the foreground",
        description="Run the continuation service (HTTP on the configured loopback address, plus "
        "the worker that synthesizes and delivers) until SIGINT/SIGTERM; then stop admitting, "
        "let in-flight work finish within a bound, and exit 0. State changes are logged as JSON "
        "lines on stderr (ids and states only).",
    )
    serve.add_argument("--config", metavar="PATH", help=CONFIG_HELP)
    serve.add_argument(
        "--outbox",
        metavar="PATH",
        help="write the outbox channels' deliveries to this JSON-lines file instead of the "
        "configured path (default: outbox.jsonl beside the config)",
    )
    serve.set_defaults(func=cmd_serve)

    add_continuations_parser(sub)
    add_tasks_parser(sub)
    add_payload_hash_parser(sub)

    demo = sub.add_parser(
        "demo",
        help="run the whole flow end to end in a temporary directory",
        description="Start the real service on embedded defaults in a temporary directory, run a "
        "scripted agent turn whose MCP tool claims a continuation, and show the later answer "
        "being delivered (about 5-40 seconds, mostly starting Python processes). Needs the MCP "
        "SDK: pip install 'afterword[mcp]' (docs/mcp.md).",
    )
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory and print its path")
    demo.add_argument(
        "--tasks",
        action="store_true",
        help="instead: an MCP Tasks server's task adopted as a continuation, followed by the "
        "service and its answer delivered once (MCP SDK 2.x; docs/tasks-bridge.md)",
    )
    demo.set_defaults(func=cmd_demo)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    import anyio

    from ..clients.mcp_sdk import McpSdkUnavailable

    try:
        from .demo import run_demo
        from .demo_tasks import run_tasks_demo
    except McpSdkUnavailable as exc:
        # The demo runs a real MCP server and client; the SDK is an optional extra.
        raise CliError(f"the demo runs a real MCP server and client: {exc}", 2, "mcp_unavailable") from None
    return anyio.run(run_tasks_demo if args.tasks else run_demo, args.keep)


def _config_problem(exc: ConfigError) -> str:
    # "$" (the whole document) means nothing to a reader: name the file instead.
    if exc.path != "$":
        return str(exc)
    if exc.file and exc.file not in exc.problem:
        return f"{exc.file}: {exc.problem}"
    return exc.problem


def _doctor_fix(exc: Exception) -> str:
    """The fix ``doctor`` prints for the rule ``exc`` names, if it knows one."""
    from .doctor import fix_for  # only on this error path: doctor imports the store's reader

    fix = fix_for(getattr(exc, "rule", ""))
    return f"; to fix: {fix} (`afterword continuations doctor` checks the whole directory)" if fix else ""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`afterword continuations list | head`): end quietly, as
        # `python -m afterword` does with SIGPIPE's default action, instead of a traceback.
        # stdout now points at /dev/null so the interpreter's last flush cannot fail again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    parser = build_parser()
    Parser.json_errors = "--json" in (sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    try:
        handler = getattr(args, "func", None) or args.handler
        code: int = handler(args)
    except ConfigError as exc:
        return report(args, "invalid_config", f"{_config_problem(exc)} (see docs/configuration.md)", 2)
    except StoreLockedError as exc:
        message = f"{exc} (stop the other `afterword serve`, or give this one its own stateDir)"
        return report(args, "state_locked", message, 1)
    except OperatorError as exc:
        return report(args, exc.code, operator_message(exc, args), EXIT_UNREACHABLE if exc.status == 0 else 1)
    except CliError as exc:
        return report(args, exc.kind, str(exc), exc.code)
    except (StoreError, WalError, DiskError) as exc:
        return report(args, "state_dir", f"state directory problem: {exc}{_doctor_fix(exc)}", 1)
    except StateError as exc:
        # Imported only here: the legacy package loads with the service, never for a verb.
        from ..legacy import MigrationError

        if not isinstance(exc, MigrationError):
            raise
        return report(args, "migration", f"{exc} (see docs/upgrading.md)", 1)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())

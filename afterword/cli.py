"""The ``afterword`` command: ``serve``, ``continuations``, ``tasks``, ``demo``.

Thin: parse arguments, call the service or the operator client, print, exit. Errors are one
line on stderr with a non-zero exit code; no traceback, no secret.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from .config import Config, ConfigError, default_config, load_config
from .disk import DiskError
from .legacy import MigrationError
from .operator import OperatorClient, OperatorError, read_operator_token
from .store import StoreError, StoreLockedError

EXIT_HEALTH = {"healthy": 0, "degraded": 1, "unhealthy": 2}
EXIT_UNREACHABLE = 3


class CliError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        self.code = code
        super().__init__(message)


def resolve_config(path: str | None, *, check_secrets: bool = True) -> Config:
    """``--config PATH``; else ./afterword.json if present; else the documented defaults."""
    if path is not None:
        return load_config(path, check_secrets=check_secrets)
    if Path("afterword.json").is_file():
        return load_config("afterword.json", check_secrets=check_secrets)
    return default_config(os.getcwd())


# -- serve ------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    import anyio

    from .serve import serve

    config = resolve_config(args.config)
    if not config.enabled:
        raise CliError("continuations are disabled in this configuration (continuations.enabled is false)", 2)
    return anyio.run(serve, config, args.outbox)


# -- continuations (operator) -------------------------------------------------------------------
def _client(args: argparse.Namespace) -> tuple[Config, OperatorClient]:
    config = resolve_config(args.config, check_secrets=False)
    try:
        token = read_operator_token(config)
    except (DiskError, OSError) as exc:
        raise CliError(f"cannot derive the operator capability from {config.state_dir}: {exc}", 1) from None
    return config, OperatorClient(config, token)


def _print_json(obj: object) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode() + "\n")


def cmd_health(args: argparse.Namespace) -> int:
    try:
        _, client = _client(args)
    except CliError as exc:
        print(f"afterword: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:
        health = client.health()
    except OperatorError as exc:
        print(f"afterword: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    finally:
        client.close()
    if args.json:
        _print_json(health)
    else:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(health.counts.items())) or "no continuations"
        extra = (
            f"; {health.history_unrecorded} delivered without history" if health.history_unrecorded else ""
        )
        print(f"{health.status}: {counts}{extra}")
        for cause in health.causes:
            print(f"  {cause.code} ({cause.status}): {cause.count} - {cause.message}")
            for command in cause.commands:
                print(f"    {command}")
            if cause.count > len(cause.ids):
                print(f"    ... and {cause.count - len(cause.ids)} more (afterword continuations list)")
    return EXIT_HEALTH.get(health.status, 2)


def _next_command(args: argparse.Namespace, cursor: str) -> str:
    parts = ["afterword", "continuations", "list"]
    if args.config:
        parts += ["--config", args.config]
    if args.limit is not None:
        parts += ["--limit", str(args.limit)]
    parts += ["--cursor", cursor]
    return shlex.join(parts)


def cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    _, client = _client(args)
    try:
        page = client.list(limit=args.limit, cursor=args.cursor)
    finally:
        client.close()
    if args.json:
        _print_json(page)
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("ID", "STATE", "ORIGIN", "MODE", "SERVER", "ATTEMPTS", "UPDATED", "LAST ERROR"):
        table.add_column(col, no_wrap=col != "LAST ERROR")
    for item in page.items:
        table.add_row(
            item.continuation_id,
            # Sticky warning: posting it again needs retry --allow-unknown.
            item.state + (" (unproven post)" if item.post_unproven else ""),
            item.origin_context,
            item.mode,
            item.server_name + (f" ({item.route})" if item.route else ""),
            f"{item.attempts.synthesis}/{item.attempts.delivery}",
            item.updated_at,
            item.last_error.code if item.last_error else "",
        )
    console = Console(width=200, highlight=False, soft_wrap=True)
    if page.items:
        console.print(table)
    else:
        console.print("no continuations")
    if page.next_cursor:
        console.print(f"more records remain; next page:\n  {_next_command(args, page.next_cursor)}")
    return 0


def _show_status(status: object, args: argparse.Namespace) -> None:
    if getattr(args, "json", False):
        _print_json(status)
    else:
        state = getattr(status, "state", "?")
        cid = getattr(status, "continuation_id", "?")
        print(f"{cid}: {state}")


def cmd_retry(args: argparse.Namespace) -> int:
    _, client = _client(args)
    try:
        _show_status(client.retry(args.id, args.allow_unknown), args)
    finally:
        client.close()
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    _, client = _client(args)
    try:
        _show_status(client.cancel(args.id), args)
    finally:
        client.close()
    return 0


def cmd_acknowledge(args: argparse.Namespace) -> int:
    _, client = _client(args)
    try:
        _show_status(client.acknowledge(args.id), args)
    finally:
        client.close()
    return 0


def cmd_resolve(args: argparse.Namespace) -> int:
    verdict = args.verdict
    kinds = {"delivered": "delivered", "not-delivered": "not_delivered", "dead-lettered": "dead_lettered"}
    if verdict not in kinds:
        raise CliError("resolve takes: delivered DELIVERY_ID | not-delivered | dead-lettered", 2)
    if verdict == "delivered" and not args.delivery_id:
        raise CliError("resolve ID delivered needs the externally verified DELIVERY_ID", 2)
    if verdict != "delivered" and args.delivery_id:
        raise CliError(f"resolve ID {verdict} takes no further argument", 2)
    _, client = _client(args)
    try:
        _show_status(client.resolve(args.id, kinds[verdict], args.delivery_id), args)
    finally:
        client.close()
    return 0


# -- parser ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="afterword", description="Durable continuations for AI agent hosts."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP service and the worker loop in the foreground")
    serve.add_argument(
        "--config", help="path of afterword.json (default: ./afterword.json or built-in defaults)"
    )
    serve.add_argument("--outbox", help="path of the outbox JSON-lines file (default: beside the config)")
    serve.set_defaults(func=cmd_serve)

    cont = sub.add_parser("continuations", help="inspect and recover continuations (operator)")
    csub = cont.add_subparsers(dest="verb", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="path of afterword.json")

    h = csub.add_parser("health", help="healthy (0), degraded (1), unhealthy (2), unreachable (3)")
    common(h)
    h.add_argument("--json", action="store_true")
    h.set_defaults(func=cmd_health)

    ls = csub.add_parser("list", help="list continuations, one page at a time")
    common(ls)
    ls.add_argument("--limit", type=int)
    ls.add_argument("--cursor")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    rt = csub.add_parser("retry", help="retry a dead-lettered or held continuation")
    common(rt)
    rt.add_argument("id")
    rt.add_argument(
        "--allow-unknown",
        action="store_true",
        help="unsafe: retry an unknown delivery after external verification",
    )
    rt.add_argument("--json", action="store_true")
    rt.set_defaults(func=cmd_retry)

    cn = csub.add_parser("cancel", help="cancel an active continuation")
    common(cn)
    cn.add_argument("id")
    cn.add_argument("--json", action="store_true")
    cn.set_defaults(func=cmd_cancel)

    ak = csub.add_parser(
        "acknowledge",
        help="acknowledge a dead letter, an expiry or a delivery missing from history (clears its health cause)",
    )
    common(ak)
    ak.add_argument("id")
    ak.add_argument("--json", action="store_true")
    ak.set_defaults(func=cmd_acknowledge)

    rs = csub.add_parser(
        "resolve", help="resolve an unknown delivery: delivered ID | not-delivered | dead-lettered"
    )
    common(rs)
    rs.add_argument("id")
    rs.add_argument("verdict")
    rs.add_argument("delivery_id", nargs="?")
    rs.add_argument("--json", action="store_true")
    rs.set_defaults(func=cmd_resolve)

    try:
        from .tasks.cli import add_tasks_parser
    except ImportError:  # pragma: no cover - the tasks package is part of the distribution
        pass
    else:
        add_tasks_parser(sub)

    demo = sub.add_parser("demo", help="run the whole flow end to end in a temporary directory")
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory")
    demo.set_defaults(func=cmd_demo)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    import anyio

    from .demo import run_demo

    return anyio.run(run_demo, args.keep)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        handler = getattr(args, "func", None) or args.handler
        code: int = handler(args)
    except ConfigError as exc:
        print(f"afterword: {exc}", file=sys.stderr)
        return 2
    except MigrationError as exc:
        print(f"afterword: {exc}", file=sys.stderr)
        return 1
    except StoreLockedError as exc:
        print(f"afterword: {exc}", file=sys.stderr)
        return 1
    except OperatorError as exc:
        print(f"afterword: {exc} ({exc.code})", file=sys.stderr)
        return EXIT_UNREACHABLE if exc.status == 0 else 1
    except CliError as exc:
        print(f"afterword: {exc}", file=sys.stderr)
        return exc.code
    except (StoreError, DiskError) as exc:
        print(f"afterword: state directory problem: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())

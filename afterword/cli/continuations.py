"""``afterword continuations ...``: the operator's verbs, over the operator client.

Each verb derives the operator capability from the owner-only state secret, calls the running
service on its loopback address and prints the answer (``--json`` for machines). ``doctor`` is
the exception: it reads the state directory itself, read-only. Exit codes are in
"docs/design.md, Contracts: command line".
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from ..clients.operator import (
    OperatorError,
)
from ..continuations.health import ACKNOWLEDGE_GIVES_UP, SEVERITY, acknowledge_consequence
from ..continuations.model import STATES
from .common import (
    CONFIG_HELP,
    EXIT_UNREACHABLE,
    JSON_HELP,
    CliError,
    operator_client,
    print_json,
    report,
    resolve_config,
)
from .render import print_detail, print_health, print_page
from .tokens import add_token_parsers
from .ui import add_ui_parser

_ID_HELP = "the continuation id (c_...), as printed by `afterword continuations list`"
_VERDICTS = {"delivered": "delivered", "not-delivered": "not_delivered", "dead-lettered": "dead_lettered"}


def positive_int(text: str) -> int:
    """``--limit``: refused while parsing (exit 2), not by the service after a round trip."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of rows")
    return value


def cmd_health(args: argparse.Namespace) -> int:
    try:
        _, client = operator_client(args)
    except CliError as exc:
        return report(args, exc.kind, str(exc), EXIT_UNREACHABLE)
    try:
        health = client.health()
    except OperatorError as exc:
        return report(args, exc.code, operator_message(exc, args), EXIT_UNREACHABLE)
    finally:
        client.close()
    if args.json:
        print_json(health)
    else:
        print_health(health)
    return SEVERITY.get(health.status, SEVERITY["unhealthy"])


def _next_command(args: argparse.Namespace, cursor: str) -> str:
    parts = ["afterword", "continuations", "list"]
    if args.config:
        parts += ["--config", args.config]
    if args.limit is not None:
        parts += ["--limit", str(args.limit)]
    for name in ("state", "server", "route"):
        if getattr(args, name) is not None:
            parts += [f"--{name}", getattr(args, name)]
    if args.newest:
        parts.append("--newest")
    parts += ["--cursor", cursor]
    return shlex.join(parts)


def cmd_list(args: argparse.Namespace) -> int:
    _, client = operator_client(args)
    try:
        page = client.list(
            limit=args.limit,
            cursor=args.cursor,
            state=args.state,
            server=args.server,
            route=args.route,
            newest=args.newest,
        )
    finally:
        client.close()
    if args.json:
        print_json(page)
        return 0
    print_page(page, _next_command(args, page.next_cursor) if page.next_cursor else None)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    _, client = operator_client(args)
    try:
        detail = client.show(args.id)
    finally:
        client.close()
    if args.json:
        print_json(detail)
        return 0
    print_detail(detail)
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    _, client = operator_client(args)
    try:
        sys.stdout.write(client.metrics())
    finally:
        client.close()
    return 0


def _show_status(status: object, args: argparse.Namespace) -> None:
    if getattr(args, "json", False):
        print_json(status)
    else:
        state = getattr(status, "state", "?")
        cid = getattr(status, "continuation_id", "?")
        print(f"{cid}: {state}")


def cmd_retry(args: argparse.Namespace) -> int:
    _, client = operator_client(args)
    try:
        _show_status(client.retry(args.id, args.allow_unknown), args)
    finally:
        client.close()
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    _, client = operator_client(args)
    try:
        _show_status(client.cancel(args.id), args)
    finally:
        client.close()
    return 0


def cmd_acknowledge(args: argparse.Namespace) -> int:
    _, client = operator_client(args)
    try:
        status = client.acknowledge(args.id)
    finally:
        client.close()
    if args.json:
        print_json(status)
        return 0
    error = f" ({status.last_error.code})" if status.last_error else ""
    print(f"{status.continuation_id}: acknowledged {status.state}{error}")
    print(f"  {acknowledge_consequence(status.state)}")
    return 0


def cmd_resolve(args: argparse.Namespace) -> int:
    verdict = args.verdict
    kinds = _VERDICTS
    if verdict not in kinds:
        raise CliError("resolve takes: delivered DELIVERY_ID | not-delivered | dead-lettered", 2)
    if verdict == "delivered" and not args.delivery_id:
        raise CliError(
            "resolve ID delivered needs the DELIVERY_ID you found in the channel "
            "(if you found no message, use not-delivered)",
            2,
        )
    if verdict != "delivered" and args.delivery_id:
        raise CliError(f"resolve ID {verdict} takes no further argument", 2)
    _, client = operator_client(args)
    try:
        _show_status(client.resolve(args.id, kinds[verdict], args.delivery_id), args)
    finally:
        client.close()
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Exit 0 when the state opens cleanly, 2 when it is damaged."""
    from .doctor import diagnose, render

    if args.state_dir is not None:
        state_dir = args.state_dir
    else:
        state_dir = resolve_config(args.config, check_secrets=False).state_dir
    diagnosis = diagnose(state_dir)
    if args.json:
        print_json(diagnosis)
    else:
        print(render(diagnosis))
    return 0 if diagnosis.healthy else 2


def operator_message(exc: OperatorError, args: argparse.Namespace) -> str:
    cid = getattr(args, "id", None)
    hints = {
        400: f"see `afterword continuations {getattr(args, 'verb', '')} -h`",
        401: "the service rejected this state directory's capability: pass the --config the service runs with",
        404: "list the known ids with `afterword continuations list`",
        409: f"see its state and history with `afterword continuations show {shlex.quote(cid)}`"
        if cid
        else None,
        410: f"its outcome and receipt: `afterword continuations show {shlex.quote(cid)}`" if cid else None,
    }
    hint = hints.get(exc.status)
    return f"{exc} ({exc.code})" + (f"; {hint}" if hint else "")


def add_continuations_parser(sub: Any) -> None:
    """Register ``continuations`` and its verbs on the top-level subparsers."""
    cont = sub.add_parser(
        "continuations",
        help="inspect and recover continuations (operator)",
        description="Operator commands. They talk to the running service on its configured "
        "loopback address with a capability derived from the owner-only secret in the state "
        "directory, so only the service's owner can run them.",
    )
    csub = cont.add_subparsers(dest="verb", required=True, metavar="VERB")

    def common(p: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
        p.add_argument("--config", metavar="PATH", help=CONFIG_HELP)
        if json_flag:
            p.add_argument("--json", action="store_true", help=JSON_HELP)

    h = csub.add_parser(
        "health",
        help="overall health; exit 0 healthy, 1 degraded, 2 unhealthy, 3 unreachable",
        description="Print healthy, degraded (work pending, an item expired, or a delivery missing "
        "from history) or unhealthy (dead-lettered or unknown delivery), with counts by state. "
        "Exit 0 healthy, 1 degraded, 2 unhealthy, 3 the service cannot be reached. For a "
        "liveness probe use GET /v1/livez instead (see docs/operating.md).",
    )
    common(h)
    h.set_defaults(func=cmd_health)

    ls = csub.add_parser(
        "list",
        help="list continuations, one page at a time",
        description="One row per continuation, oldest first. OUTCOME says how a finished one "
        "ended (posted, captured, suppressed, silent, resolved; 'fallback' when the fixed "
        "origin-unavailable answer was used); a delivery_retry is either scheduled (next TIME) "
        "or held for an operator retry, and '(posting)' marks a delivery attempt in flight. "
        "ORIGIN is the origin context; COMPACTED says retention compacted the finished record "
        "(payload and answer dropped, outcome kept). ATTEMPTS is synthesis/delivery, counted "
        "across operator retries.",
    )
    common(ls)
    ls.add_argument(
        "--limit",
        type=positive_int,
        metavar="N",
        help="at most N rows, N >= 1 (default and maximum: operatorPageSize)",
    )
    ls.add_argument(
        "--cursor", metavar="CURSOR", help="continue after the previous page (printed when more remain)"
    )
    ls.add_argument(
        "--state",
        choices=STATES,
        metavar="STATE",
        help="only continuations in this state: " + ", ".join(STATES),
    )
    ls.add_argument("--server", metavar="NAME", help="only continuations claimed by this server")
    ls.add_argument("--route", metavar="ROUTE", help="only continuations on this named route")
    ls.add_argument("--newest", action="store_true", help="newest first (the default is oldest first)")
    ls.set_defaults(func=cmd_list)

    sh = csub.add_parser(
        "show",
        help="one continuation in full: status, attempts, receipt and state history",
        description="Everything the status endpoint reports, plus the server and route, the task "
        "key, cumulative attempts, the receipt, the completion kind, the last error and the "
        "record's state history with times. Never a token, payload or answer text.",
    )
    common(sh)
    sh.add_argument("id", metavar="ID", help=_ID_HELP)
    sh.set_defaults(func=cmd_show)

    rt = csub.add_parser(
        "retry",
        help="retry a dead-lettered or held continuation",
        description="Schedule delivery (or synthesis, if no answer was written yet) of a "
        "dead-lettered or held continuation now. A delivery_unknown one is refused: check the "
        "channel and `resolve` it instead. Refused as well while a delivery attempt is in "
        "flight (wait for its outcome) and when chunks of the answer already have receipts "
        "(resolve it); a record retention compacted answers `compacted`.",
    )
    common(rt)
    rt.add_argument("id", metavar="ID", help=_ID_HELP)
    rt.add_argument(
        "--allow-unknown",
        action="store_true",
        help="unsafe: also retry a delivery_unknown continuation, after you verified outside "
        "afterword that posting it again cannot duplicate a message",
    )
    rt.set_defaults(func=cmd_retry)

    cn = csub.add_parser(
        "cancel",
        help="cancel an active continuation",
        description="Cancel work that has not finished. Repeating it on a cancelled item is a "
        "no-op; other finished states are refused and kept. Refused while a delivery attempt "
        "is in flight: the post may already have reached the channel, so wait for its outcome.",
    )
    common(cn)
    cn.add_argument("id", metavar="ID", help=_ID_HELP)
    cn.set_defaults(func=cmd_cancel)

    ak = csub.add_parser(
        "acknowledge",
        help="give up on a dead letter, an expiry or a delivery missing from history (clears its "
        "health cause; a dead letter can then no longer be retried)",
        description="Record that you have seen a dead-lettered or expired continuation, or a "
        "delivery missing from history, and give it up: it stops counting against health and "
        "becomes subject to retention. Nothing is posted or retried. For a dead letter, try "
        "`show ID` and `retry ID` first: "
        + ACKNOWLEDGE_GIVES_UP
        + ", and any later verb on it answers `compacted`.",
    )
    common(ak)
    ak.add_argument("id", metavar="ID", help=_ID_HELP)
    ak.set_defaults(func=cmd_acknowledge)

    rs = csub.add_parser(
        "resolve",
        help="record your verdict on an unknown delivery",
        description="After checking the channel yourself, record what happened to a "
        "delivery_unknown continuation: `delivered DELIVERY_ID` (records the receipt and posts "
        "nothing), `not-delivered` (holds it for an explicit retry) or `dead-lettered` (gives up).",
    )
    common(rs)
    rs.add_argument("id", metavar="ID", help=_ID_HELP)
    rs.add_argument(
        "verdict",
        choices=list(_VERDICTS),
        metavar="VERDICT",
        help="one of: delivered (needs DELIVERY_ID), not-delivered, dead-lettered",
    )
    rs.add_argument(
        "delivery_id",
        nargs="?",
        metavar="DELIVERY_ID",
        help="with `delivered`: the channel's id of the message you found (e.g. a Slack ts)",
    )
    rs.set_defaults(func=cmd_resolve)

    mt = csub.add_parser(
        "metrics",
        help="print the Prometheus metrics text",
        description="Print what GET /v1/operator/metrics serves, in the Prometheus text format.",
    )
    common(mt, json_flag=False)
    mt.add_argument("--json", action="store_true", help="errors as JSON (the metrics stay text)")
    mt.set_defaults(func=cmd_metrics)

    dr = csub.add_parser(
        "doctor",
        help="read-only: what in the state directory is damaged and how to restore it",
        description=(
            "Read the state directory without locking or changing it (also while the service "
            "runs) and say whether it opens cleanly; if not, which file breaks which rule and "
            "what a restore from backup needs. Exit 0 clean, 2 damaged."
        ),
    )
    common(dr)
    dr.add_argument("--state-dir", help="check this directory (e.g. a backup) instead of the config's")
    dr.set_defaults(func=cmd_doctor)
    add_token_parsers(csub, common)
    add_ui_parser(csub, common)

"""``afterword continuations ui [--open]``: a one-time login link to the status page.

The CLI spends the operator capability once, over the loopback operator API, to have the
running service mint a link that works once and for a minute; the capability itself never
reaches the browser (docs/operating.md, "The status page").
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..continuations.rules import parse_deadline_format
from ..disk import DiskError
from .common import operator_client, print_json

_DESCRIPTION = (
    "Print a login link for the status page that `afterword serve` shows under /ui. The link "
    "works once, within a minute, and signs the browser in with a session cookie that expires; "
    "the operator capability itself never reaches the browser. Run it as the user that owns "
    "the state directory, on the machine the service runs on."
)


def cmd_ui(args: argparse.Namespace) -> int:
    _, client = operator_client(args)
    try:
        body = client.ui_login()
    finally:
        client.close()
    if args.json:
        print_json(body)
    else:
        print(body.login_url)
        print(f"valid once, until {body.expires_at}", file=sys.stderr)
    if args.open:
        _open(body.login_url, parse_deadline_format(body.expires_at))
    return 0


def _open(url: str, expires_at_ms: int) -> None:
    """Through a private forwarding file: the link never reaches a command line (loginpage)."""
    from .loginpage import open_login_link  # webbrowser and html: only when a browser is asked for

    try:
        opened = open_login_link(url, expires_at_ms)
    except (OSError, DiskError) as exc:
        # The error names the temporary directory at most, never the link.
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        print(
            f"afterword: cannot write the login page ({reason}); open the link above yourself",
            file=sys.stderr,
        )
        return
    if not opened:
        print("afterword: no browser could be started; open the link above yourself", file=sys.stderr)


def add_ui_parser(csub: Any, common: Any) -> None:
    p = csub.add_parser(
        "ui", help="print (or --open) a one-time login link to the status page", description=_DESCRIPTION
    )
    common(p)
    p.add_argument(
        "--open",
        action="store_true",
        help="also open the link in the default browser (through a private file that forwards "
        "to it, so the link is never on a command line)",
    )
    p.set_defaults(func=cmd_ui)

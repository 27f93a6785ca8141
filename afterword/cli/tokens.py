"""``afterword continuations metrics-token|host-token``: hand a narrower capability to
another process through an owner-only file.

Both are derived from the state directory's secret, so they survive restarts, and neither is
ever printed: the file (mode 0600, replaced atomically) is the only copy outside the state
directory.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..clients.operator import read_host_token, read_metrics_token
from ..config import Config
from .common import CliError, derive_capability, resolve_config


def _refuse_unsafe_target(target: Path) -> None:
    """An existing file is replaced only if it is a plain file of ours with no other name:
    a symlink, another user's file or a hard link could hand the capability to someone else."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a symlink"
            if stat.S_ISLNK(st.st_mode)
            else "a directory"
            if stat.S_ISDIR(st.st_mode)
            else "not a regular file"
        )
        raise CliError(f"refusing to replace {target}: it is {kind}; name a new file", 1, "unsafe_target")
    if st.st_uid != os.geteuid() or st.st_nlink != 1:
        raise CliError(
            f"refusing to replace {target}: it belongs to another user or has other hard links",
            1,
            "unsafe_target",
        )


def _write_token(args: argparse.Namespace, read: Callable[[Config], str], what: str, *, guarded: bool) -> int:
    from ..disk import write_private_file

    if args.legacy_path is not None:
        if args.file is not None:
            raise CliError("give the file once, as --file PATH", 2)
        print(
            f"afterword: `{args.verb} PATH` is deprecated; write `{args.verb} --file PATH`",
            file=sys.stderr,
        )
    path = args.file or args.legacy_path
    if path is None:
        raise CliError(f"{args.verb} needs --file PATH (the file to write)", 2)
    config = resolve_config(args.config, check_secrets=False)
    token = derive_capability(config, read)
    target = Path(os.path.abspath(path))
    if guarded:
        _refuse_unsafe_target(target)
    try:
        write_private_file(str(target), token.encode())
    except OSError as exc:
        raise CliError(
            f"cannot write {target}: {exc.strerror or exc} (choose a writable path)", 1, "io"
        ) from None
    # The token itself is never printed: the file is the only copy outside the state directory.
    print(f"wrote {what} to {target} (mode 0600)")
    return 0


def cmd_metrics_token(args: argparse.Namespace) -> int:
    # Not guarded: the documented setup chowns the file to the scraper's user and rewrites it
    # later; the capability it holds opens the metrics and nothing else.
    return _write_token(args, read_metrics_token, "the read-only metrics capability", guarded=False)


def cmd_host_token(args: argparse.Namespace) -> int:
    # The host process reads the file (docs/host-api.md).
    return _write_token(args, read_host_token, "the host capability", guarded=True)


_FILE_HELP = "file to write (created 0600, replaced atomically)"


def add_token_parsers(csub: Any, common: Callable[..., None]) -> None:
    """Register ``metrics-token`` and ``host-token`` under ``continuations``."""
    mk = csub.add_parser(
        "metrics-token",
        help="write the read-only metrics capability to a file (for a scraper)",
        description="Write a capability that opens GET /v1/operator/metrics and nothing else to "
        "the --file PATH (mode 0600, replaced atomically), for Prometheus' "
        "authorization.credentials_file. "
        "It is derived from the state directory's secret, so it survives restarts; the operator "
        "capability itself never leaves the CLI.",
    )
    common(mk)
    mk.add_argument("--file", metavar="PATH", help=_FILE_HELP)
    # The first releases took the path as an argument; still accepted, with a warning.
    mk.add_argument("legacy_path", nargs="?", metavar="PATH", help="deprecated: use --file PATH")
    mk.set_defaults(func=cmd_metrics_token)
    ht = csub.add_parser(
        "host-token",
        help="write the host capability to a file (for a host that binds runs over HTTP)",
        description="Write the capability that opens the /v1/host API (begin, close, finalize, "
        "activate and abandon runs; read captured text) to the --file PATH, mode 0600, replaced "
        "atomically. "
        "It is derived from the state directory's secret and survives restarts. It is never "
        "printed; an existing symlink, hard link or another user's file at PATH is refused.",
    )
    common(ht)
    ht.add_argument("--file", required=True, metavar="PATH", help=_FILE_HELP)
    ht.set_defaults(func=cmd_host_token, legacy_path=None)

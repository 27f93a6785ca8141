"""``afterword continuations ui --open`` without the link on a command line.

A browser started with the login link as an argument shows it to every local user (``ps``,
``/proc/PID/cmdline``), and one who is quick spends it first. So the link goes into a small
HTML file instead, 0600 in a fresh 0700 directory, that forwards to it; the browser gets the
file's path. The file is removed once the link has expired (by a small detached process, so
the command returns at once), or at once when no browser could be started.
"""

from __future__ import annotations

import html
import subprocess
import sys
import time
import webbrowser
from collections.abc import Callable
from pathlib import Path

from ..disk.scratch import private_scratch_file, remove_private_scratch

__all__ = ["GRACE_S", "login_page", "open_login_link"]

# After the link's expiry, before the file goes: the link is dead by then, whatever the clocks.
GRACE_S = 2.0
PREFIX = "afterword-ui-"
# Only the file's path and a delay reach this process's command line, never the link.
_CLEANER = (
    "import sys, time\n"
    "from afterword.disk.scratch import remove_private_scratch\n"
    "time.sleep(float(sys.argv[2]))\n"
    "remove_private_scratch(sys.argv[1])\n"
)


def login_page(url: str) -> bytes:
    """The forwarding page: a meta refresh (no script) and a plain link as a fallback."""
    href = html.escape(url, quote=True)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        '<meta name="referrer" content="no-referrer">\n'
        f'<meta http-equiv="refresh" content="0;url={href}">\n'
        "<title>afterword: signing in</title></head>\n"
        f'<body><p>Signing in to the afterword status page&hellip; <a href="{href}">continue</a></p>'
        "</body></html>\n"
    ).encode()


def _spawn_cleaner(path: str, delay_s: float) -> None:
    subprocess.Popen(
        [sys.executable, "-c", _CLEANER, path, f"{delay_s:.3f}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not killed with the terminal's Ctrl-C, nor waited for
        close_fds=True,
    )


def open_login_link(
    url: str,
    expires_at_ms: int,
    *,
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    opener: Callable[[str], bool] | None = None,
    spawn_cleaner: Callable[[str, float], None] | None = None,
) -> bool:
    """Open ``url`` in a browser through a private forwarding file; whether one started.

    Raises OSError or :class:`~afterword.disk.DiskError` when the file cannot be written
    (neither names the link).
    """
    open_ = opener if opener is not None else webbrowser.open
    cleaner = spawn_cleaner if spawn_cleaner is not None else _spawn_cleaner
    path = private_scratch_file("login.html", login_page(url), prefix=PREFIX)
    try:
        opened = bool(open_(Path(path).as_uri()))
    except Exception:  # webbrowser.Error, or a launcher that failed in its own way
        opened = False
    except BaseException:
        remove_private_scratch(path)
        raise
    if not opened:
        remove_private_scratch(path)
        return False
    delay_s = max(0.0, (expires_at_ms - now_ms()) / 1000) + GRACE_S
    try:
        cleaner(path, delay_s)
    except OSError:
        # No helper process: keep the file for the browser here, then remove it.
        print(f"afterword: removing the login page in {delay_s:.0f} s", file=sys.stderr)
        try:
            time.sleep(delay_s)
        finally:
            remove_private_scratch(path)
    return True

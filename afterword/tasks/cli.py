"""``afterword tasks list|show``: an operator's read view of the task journal.

The journal's record store is owned by one process at a time (an exclusive lock), so this
view opens it only while the host that writes it is not running; otherwise it says so and
exits 3. A state directory that does not exist is an empty journal: nothing is created.

Exit codes: 0 success, 1 no such task, 2 usage error, 3 the journal cannot be opened.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import msgspec

from ..disk import DiskError
from ..store import RecordStore, StoreError, StoreLockedError
from . import core
from .journal import TaskJournal
from .records import TaskRecord

DEFAULT_STATE_DIR = ".mono-agent/tasks"
STATE_DIR_ENV = "AFTERWORD_TASKS_STATE_DIR"
SHOW_OUTPUT_BYTES = 64 * 1024
_json = msgspec.json.Encoder()


class JournalUnavailable(Exception):
    """The journal's state directory exists but cannot be opened (locked or unsafe)."""


def add_tasks_parser(subparsers: Any) -> None:
    """Register ``tasks list`` and ``tasks show`` on an ``argparse`` subparsers object."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        default=None,
        help=f"task journal state directory (default: ${STATE_DIR_ENV} or {DEFAULT_STATE_DIR})",
    )
    tasks = subparsers.add_parser("tasks", help="inspect the background task journal")
    actions = tasks.add_subparsers(dest="tasks_command", required=True)
    listing = actions.add_parser("list", parents=[common], help="list tasks, oldest first")
    listing.add_argument("--session", default=None, help="only tasks of this session")
    listing.add_argument("--json", action="store_true", help='print {"items": [...]}')
    show = actions.add_parser(
        "show", parents=[common], help="show one task and why it was or was not notified"
    )
    show.add_argument("task_id")
    show.add_argument("--json", action="store_true")
    show.add_argument("--output", action="store_true", help="also print the captured output tail")
    tasks.set_defaults(handler=handle_tasks)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def task_view(task: TaskRecord) -> dict[str, Any]:
    """The JSON shape of a task for operators: camelCase record fields plus derived facts."""
    raw = msgspec.to_builtins(task)
    view = {_camel(k): v for k, v in raw.items()}
    view["signalName"] = core.signal_name(task.signal)
    view["notificationBlockers"] = core.blockers(task)
    return view


def _open(state_dir: str) -> RecordStore | None:
    if not os.path.isdir(state_dir):
        return None
    try:
        return RecordStore.open(state_dir)
    except StoreLockedError as exc:
        raise JournalUnavailable(f"{exc}; stop the host that owns it to inspect the journal") from None
    except (StoreError, DiskError) as exc:
        raise JournalUnavailable(str(exc)) from None


def _flags(task: TaskRecord) -> str:
    marks = [
        ("committed", task.committed),
        ("delivered", task.delivered),
        ("consumed", task.consumed),
    ]
    return ",".join(name for name, on in marks if on) or "-"


def _state(task: TaskRecord) -> str:
    if task.exit_code is not None:
        return f"{task.state}({task.exit_code})"
    if task.signal is not None:
        return f"{task.state}({core.signal_name(task.signal)})"
    return task.state


def _print_list(tasks: Sequence[TaskRecord], out: TextIO) -> None:
    rows = [("TASK", "SESSION", "STATE", "NOTIFY", "FLAGS", "COMMAND")]
    for t in tasks:
        command = " ".join(t.command)
        rows.append((t.task_id, t.session_id, _state(t), t.notify, _flags(t), command[:60]))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)]
        out.write("  ".join([*cells, row[5]]).rstrip() + "\n")


def _print_show(journal: TaskJournal, task: TaskRecord, with_output: bool, out: TextIO) -> None:
    for key, value in task_view(task).items():
        if key == "notificationBlockers":
            continue
        out.write(f"{key}: {value}\n")
    reasons = core.blockers(task)
    if task.delivered:
        out.write(f"notification: delivered as {task.notification_id}\n")
    elif not reasons:
        out.write("notification: eligible, waiting for a closed tool-call pairing\n")
    else:
        out.write(f"notification: not eligible ({', '.join(reasons)})\n")
    if with_output:
        excerpt = journal.read_output_tail(task, SHOW_OUTPUT_BYTES)
        shown = f"last {excerpt.excerpt_bytes} of {excerpt.total_bytes} bytes"
        out.write(f"--- untrusted process output ({shown}) ---\n")
        out.write(excerpt.text)
        if excerpt.text and not excerpt.text.endswith("\n"):
            out.write("\n")
        out.write("--- end of output ---\n")


def handle_tasks(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``tasks list`` or ``tasks show`` for parsed ``args``; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    state_dir = args.state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
    try:
        store = _open(state_dir)
    except JournalUnavailable as exc:
        err.write(f"afterword tasks: cannot open task journal: {exc}\n")
        return 3
    try:
        journal = TaskJournal(store) if store is not None else None
        if args.tasks_command == "list":
            tasks = journal.tasks(args.session) if journal is not None else []
            if args.json:
                out.write(_json.encode({"items": [task_view(t) for t in tasks]}).decode() + "\n")
            else:
                _print_list(tasks, out)
            return 0
        task = journal.get(args.task_id) if journal is not None else None
        if journal is None or task is None:
            err.write(f"afterword tasks: no task {args.task_id!r} in {state_dir}\n")
            return 1
        if args.json:
            view = task_view(task)
            if args.output:
                view["untrustedProcessOutput"] = msgspec.to_builtins(
                    journal.read_output_tail(task, SHOW_OUTPUT_BYTES)
                )
            out.write(_json.encode(view).decode() + "\n")
        else:
            _print_show(journal, task, args.output, out)
        return 0
    finally:
        if store is not None:
            store.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m afterword.tasks.cli tasks list``) until the main CLI wires it."""
    parser = argparse.ArgumentParser(prog="afterword")
    add_tasks_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())

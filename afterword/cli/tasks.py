"""``afterword tasks list|show|cancel``: an operator's view of the task journal, and a cancel.

The view reads the store read-only (:func:`afterword.store.open_readonly`: no lock, no repair,
no checkpoint, nothing written), so it works while the host that owns the journal runs; a
tail of the log that is not yet durable is simply not shown. A state directory that does not
exist is an error (exit 3), and nothing is created.

Everything printed is text the terminal shows as text: commands are shell-quoted, times are
ISO 8601 (UTC), and process output (``show --output``) has terminal escape sequences removed,
other control characters made visible, and every line prefixed with ``| `` so it cannot pass
itself off as the view's own frame.

``cancel`` is the one verb that acts, and it never opens the store for writing (the host owns
it): it leaves a cancel request file beside the task's output (``tasks/<id>.cancel``, through
the disk seam), which the host's supervisor reads as the user's cancel when it records the end,
then sends SIGTERM to the task's wrapper (whose identity it checks first) and SIGKILL to the
task's process group after ``--grace`` seconds.

Exit codes: 0 success, 1 no such task, 2 usage error, 3 the journal cannot be opened.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO, cast

import msgspec

from ..disk import DiskError, StateRoot, UnsafeStateError
from ..errors import StateError
from ..store import Record, RecordStore, StoreError, StoreView, open_readonly
from ..tasks import core, procinfo
from ..tasks.errors import TaskJournalCorrupt
from ..tasks.journal import TaskJournal
from ..tasks.records import SessionControl, TaskRecord
from ..wal import WalError

DEFAULT_STATE_DIR = ".mono-agent/tasks"
STATE_DIR_ENV = "AFTERWORD_TASKS_STATE_DIR"
SHOW_OUTPUT_BYTES = 64 * 1024
_json = msgspec.json.Encoder()


_TIME_FIELDS = {"createdAt", "startedAt", "endedAt", "committedAt", "deliveredAt", "consumedAt", "updatedAt"}
# Terminal escape sequences: CSI, OSC (ended by BEL or ST), and two-byte ESC sequences.
_ESCAPES = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])|\x9b[0-?]*[ -/]*[@-~]"
)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
OUTPUT_PREFIX = "| "


class JournalUnavailable(StateError):
    """The journal's state directory is missing or cannot be read (unsafe or damaged)."""


def clean(text: str, *, one_line: bool = True) -> str:
    """``text`` safe for a terminal: escape sequences removed, other controls made visible."""
    text = _ESCAPES.sub("", text)
    if one_line:
        text = text.replace("\n", "\\n").replace("\t", "\\t")
    return _CONTROLS.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text
    )


def iso(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat()


class _Snapshot:
    """Feeds a read-only view's records to a :class:`TaskJournal` (it only reads them)."""

    def __init__(self, view: StoreView) -> None:
        self.root = view.root
        self._view = view

    def watch(self, prefix: str, fn: Callable[[str, Record | None, Record | None], None]) -> None:
        for record in sorted(self._view.items(prefix), key=lambda r: r.key):
            fn(record.key, None, record)


def add_tasks_parser(subparsers: Any) -> None:
    """Register ``tasks list`` and ``tasks show`` on an ``argparse`` subparsers object."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        default=None,
        help=f"task journal state directory (default: ${STATE_DIR_ENV} or {DEFAULT_STATE_DIR})",
    )
    tasks = subparsers.add_parser(
        "tasks",
        help="inspect the background task journal",
        description="Read-only view of the background task journal; works while a host owns it.",
    )
    actions = tasks.add_subparsers(dest="tasks_command", required=True, metavar="VERB")
    listing = actions.add_parser(
        "list", parents=[common], help="list tasks, oldest first", description="List tasks, oldest first."
    )
    listing.add_argument("--session", default=None, help="only tasks of this session")
    listing.add_argument("--json", action="store_true", help='print {"items": [...]}')
    show = actions.add_parser(
        "show",
        parents=[common],
        help="show one task and why it was or was not notified",
        description="Show one task: its command, end, and its notification and consumption facts.",
    )
    show.add_argument("task_id", help="the task's id, as `afterword tasks list` prints it")
    show.add_argument("--json", action="store_true", help="print the task as one JSON object")
    show.add_argument("--output", action="store_true", help="also print the captured output tail")
    cancel = actions.add_parser(
        "cancel",
        parents=[common],
        help="cancel a running task (its end is not notified)",
        description="Ask for a task's cancel and stop its command: SIGTERM, SIGKILL after --grace.",
    )
    cancel.add_argument("task_id", help="the task's id, as `afterword tasks list` prints it")
    cancel.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    tasks.set_defaults(handler=handle_tasks)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _camelize(struct: msgspec.Struct) -> dict[str, Any]:
    view = {_camel(k): v for k, v in msgspec.to_builtins(struct).items()}
    for key in _TIME_FIELDS & view.keys():
        view[key] = iso(view[key])
    return view


def task_view(task: TaskRecord) -> dict[str, Any]:
    """The JSON shape of a task for operators: camelCase record fields (times in ISO 8601)
    plus derived facts."""
    view = _camelize(task)
    view["signalName"] = core.signal_name(task.signal)
    view["notificationBlockers"] = core.blockers(task)
    return view


def control_view(control: SessionControl) -> dict[str, Any]:
    """A session's switches: interrupted, goal, retries exhausted, last error."""
    view = _camelize(control)
    view["retriesExhausted"] = view.pop("awaitingUser")
    return view


def _open(state_dir: str) -> TaskJournal:
    if not os.path.isdir(state_dir):
        raise JournalUnavailable(f"no task journal at {state_dir} (the directory does not exist)")
    try:
        view = open_readonly(state_dir)
        return TaskJournal(cast(RecordStore, _Snapshot(view)))
    except (StoreError, WalError, DiskError, TaskJournalCorrupt) as exc:
        hint = _FIXABLE.get(exc.rule, "") if isinstance(exc, UnsafeStateError) else ""
        raise JournalUnavailable(f"{exc}{hint}") from None


# Rules a reader can fix in place; the rule name alone does not say what to do.
_FIXABLE = {
    "permissive_mode": " (the journal must be owner-only: chmod 0700 its directories and 0600 its files)",
    "wrong_owner": " (run as the user that owns the journal, or chown it back to that user)",
}


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


def _switches(control: SessionControl) -> str:
    marks = [
        ("interrupted", control.interrupted),
        (f"goal={control.goal}", control.goal != "none"),
        ("retries-exhausted", control.awaiting_user),
        (f"model-failures={control.model_failures}", control.model_failures > 0),
    ]
    return ",".join(name for name, on in marks if on) or "-"


def _print_list(journal: TaskJournal, tasks: Sequence[TaskRecord], out: TextIO) -> None:
    rows = [("TASK", "SESSION", "STATE", "NOTIFY", "FLAGS", "COMMAND")]
    for t in tasks:
        command = clean(shlex.join(t.command))
        rows.append((t.task_id, clean(t.session_id), _state(t), t.notify, _flags(t), command[:60]))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)]
        out.write("  ".join([*cells, row[5]]).rstrip() + "\n")
    for session_id in sorted({t.session_id for t in tasks}):
        control = journal.control(session_id)
        switches = _switches(control)
        if switches != "-" or control.last_error:
            error = f" last error: {clean(control.last_error)}" if control.last_error else ""
            out.write(f"session {clean(session_id)}: {switches}{error}\n")


def _print_show(journal: TaskJournal, task: TaskRecord, with_output: bool, out: TextIO) -> None:
    for key, value in task_view(task).items():
        if key == "notificationBlockers":
            continue
        if key == "command":
            value = shlex.join(task.command)
        out.write(f"{key}: {clean(str(value))}\n")
    control = journal.control(task.session_id)
    out.write(f"session switches: {_switches(control)}\n")
    if control.last_error:
        out.write(f"session last error: {clean(control.last_error)}\n")
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
        out.write(f"--- untrusted process output ({shown}), each line prefixed {OUTPUT_PREFIX!r} ---\n")
        for line in excerpt.text.splitlines():
            out.write(OUTPUT_PREFIX + clean(line) + "\n")
        out.write("--- end of output ---\n")


def _cancel(state_dir: str, task: TaskRecord, grace: float, out: TextIO, err: TextIO) -> int:
    if not grace >= 0:
        err.write("afterword tasks: --grace must be a number of seconds >= 0\n")
        return 2
    if core.is_terminal(task):
        out.write(f"task {task.task_id} already ended: {_state(task)}\n")
        return 0
    try:
        StateRoot(state_dir, create=False).write_atomic(TaskJournal.cancel_request_path(task.task_id), b"{}")
    except (DiskError, OSError) as exc:
        err.write(f"afterword tasks: cannot record the cancel request: {clean(str(exc))}\n")
        return 3
    pid, identity = task.pid, task.process_identity
    if pid is None or procinfo.probe(pid, identity) != "alive":
        out.write(
            f"cancel of {task.task_id} recorded; its process is not running, the host records the end\n"
        )
        return 0
    try:
        os.kill(pid, signal.SIGTERM)  # the wrapper passes it on to the task's process group
    except ProcessLookupError:
        out.write(f"cancel of {task.task_id} recorded; its process had just ended\n")
        return 0
    deadline = time.monotonic() + grace
    while procinfo.probe(pid, identity) == "alive" and time.monotonic() < deadline:
        time.sleep(0.05)
    if procinfo.probe(pid, identity) == "alive":
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out.write(f"cancel of {task.task_id}: sent SIGTERM, then SIGKILL after {grace:g} s\n")
    else:
        out.write(f"cancel of {task.task_id}: sent SIGTERM, the command stopped\n")
    return 0


def handle_tasks(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``tasks list`` or ``tasks show`` for parsed ``args``; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    state_dir = args.state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
    try:
        journal = _open(state_dir)
    except JournalUnavailable as exc:
        err.write(f"afterword tasks: cannot open task journal: {clean(str(exc))}\n")
        return 3
    if args.tasks_command == "list":
        tasks = journal.tasks(args.session)
        if args.json:
            out.write(_json.encode({"items": [task_view(t) for t in tasks]}).decode() + "\n")
        else:
            _print_list(journal, tasks, out)
        return 0
    task = journal.get(args.task_id)
    if task is None:
        err.write(f"afterword tasks: no task {clean(args.task_id)!r} in {state_dir}\n")
        return 1
    if args.tasks_command == "cancel":
        return _cancel(state_dir, task, args.grace, out, err)
    if args.json:
        view = task_view(task)
        view["session"] = control_view(journal.control(task.session_id))
        if args.output:
            view["untrustedProcessOutput"] = msgspec.to_builtins(
                journal.read_output_tail(task, SHOW_OUTPUT_BYTES)
            )
        out.write(_json.encode(view).decode() + "\n")
    else:
        _print_show(journal, task, args.output, out)
    return 0

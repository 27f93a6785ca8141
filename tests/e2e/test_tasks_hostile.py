"""Commands that turn on their own files: only the task that did it fails (issue 30, point 1).

A command can reach its capture file through ``/proc/self/fd/1`` and chmod or hard-link it.
That breaks the journal's file rules for that one file; the task ends ``failed`` with the
cause and is notified like any other ending, while the runtime, the other sessions and the
next start go on. A fault of the journal's own state (its directories, its log) still fails
closed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from afterword.disk import UnsafeStateError
from afterword.history import Message, ToolCall
from afterword.store import RecordStore
from afterword.tasks import NOTIFICATION_KIND, TaskRuntime, ToolResult, parse_notification
from tests._disk_helpers import SMALL

CHMOD = 'chmod 644 "$(readlink /proc/$$/fd/1)"; echo chmodded'
LINK = 'ln "$(readlink /proc/$$/fd/1)" "$LINK_TO"; echo linked'
SYMLINK = 'f="$(readlink /proc/$$/fd/1)"; rm "$f"; ln -s /etc/hostname "$f"; echo swapped'
DIRECTORY = 'f="$(readlink /proc/$$/fd/1)"; rm "$f"; mkdir "$f"; echo directory'
DELETE = 'rm "$(readlink /proc/$$/fd/1)"; echo deleted'
HONEST = "echo honest"


class Model:
    """Calls ``run`` with the command named in the user's message; answers everything else."""

    def __init__(self) -> None:
        self.n = 0

    async def __call__(self, session_id: str, context: Sequence[Message]) -> list[Message]:
        self.n += 1
        last = context[-1]
        mid = f"{session_id}-m{self.n}"
        if last.role == "user" and last.meta.get("kind") is None:
            call = ToolCall(id=f"{session_id}-c{self.n}", name="run", arguments=json.dumps(last.content))
            return [Message(id=mid, role="assistant", content="", tool_calls=(call,))]
        return [Message(id=mid, role="assistant", content="noted")]


def tools(rt: TaskRuntime, env: dict[str, str]):  # type: ignore[no-untyped-def]
    async def execute(session_id: str, call: ToolCall) -> ToolResult:
        task = await rt.start_task(session_id, call, ["sh", "-c", json.loads(call.arguments)], env=env)
        return ToolResult(content=f"started {task.task_id}")

    return execute


async def settled(rt: TaskRuntime, sessions: Sequence[str]) -> None:
    with anyio.fail_after(30):
        while True:
            tasks = [t for s in sessions for t in rt.journal.tasks(s)]
            if tasks and all(t.consumed for t in tasks) and not any(rt.coordinator.busy(s) for s in sessions):
                return
            await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_a_command_that_tampers_with_its_capture_fails_only_itself(
    state_dir: str, tmp_path: Path
) -> None:
    env = {**os.environ, "LINK_TO": str(tmp_path / "stolen.out")}
    commands = {
        "chmod": CHMOD,
        "link": LINK,
        "symlink": SYMLINK,
        "directory": DIRECTORY,
        "delete": DELETE,
        "honest": HONEST,
    }
    with RecordStore.open(state_dir, options=SMALL) as store:
        async with TaskRuntime.open(store, Model(), make_tools=lambda rt: tools(rt, env)) as rt:
            for session, command in commands.items():
                await rt.user_turn(session, Message(id=f"{session}-u", role="user", content=command))
            await settled(rt, list(commands))
            ended = {s: rt.journal.tasks(s)[0] for s in commands}
            notes = {
                s: [m for m in await rt.history.latest(s, 20) if m.meta.get("kind") == NOTIFICATION_KIND]
                for s in commands
            }
    rules = {
        "chmod": "permissive_mode",
        "link": "hard_link",
        "symlink": "symlink",
        "directory": "not_regular",
    }
    for session, rule in rules.items():
        task = ended[session]
        assert task.state == "failed" and task.exit_code == 0, task
        assert (
            task.error is not None and "changed from outside the journal" in task.error and rule in task.error
        )
        (note,) = notes[session]  # notified like any ending, without the untrusted capture
        body = parse_notification(note)
        assert body.task.state == "failed" and body.untrusted_process_output.text == ""
    assert ended["honest"].state == "exited" and ended["honest"].error is None
    # A deleted capture is no rule broken, just no output: the task ends as its command did.
    assert ended["delete"].state == "exited" and len(notes["delete"]) == 1
    assert "honest" in parse_notification(notes["honest"][0]).untrusted_process_output.text
    # The next start reads the tampered files again (notification rendering, recovery) and lives.
    with RecordStore.open(state_dir, options=SMALL) as store:
        async with TaskRuntime.open(store, Model()) as rt:
            assert rt.journal.read_output_tail(ended["chmod"], 100).unavailable is not None
            assert (await rt.wake("chmod")).reason == "nothing_pending"


@pytest.mark.anyio
async def test_a_tampered_exit_status_file_fails_only_its_task(state_dir: str) -> None:
    # The wrapper's status file is the task's too: a command that waits for it and chmods it
    # (here: done by hand after the end, before a restart reads it) fails that task alone.
    with RecordStore.open(state_dir, options=SMALL) as store:
        async with TaskRuntime.open(store, Model(), on_exit="detach") as rt:
            task = await rt.supervisor.start("s", "c", ["sh", "-c", "sleep 0.3"])
    status = Path(state_dir, "tasks", f"{task.task_id}.exit")
    with anyio.fail_after(30):
        while not status.exists():
            await anyio.sleep(0.02)
    status.chmod(0o644)
    with RecordStore.open(state_dir, options=SMALL) as store:
        async with TaskRuntime.open(store, Model()) as rt:
            # The wrapper may still be exiting when the restart looks: then it is adopted first.
            ended = await rt.supervisor.wait(task.task_id, 30)
    # Without a trusted record the end is unknown: lost, with the cause named.
    assert ended.state == "lost" and ended.error is not None and "exit status file" in ended.error


@pytest.mark.anyio
async def test_the_journals_own_files_still_fail_closed(state_dir: str) -> None:
    with RecordStore.open(state_dir, options=SMALL) as store:
        async with TaskRuntime.open(store, Model(), on_exit="stop") as rt:
            task = await rt.supervisor.start("s", "c", ["sh", "-c", "sleep 30"])
            Path(state_dir, "tasks").chmod(0o755)  # the directory is the journal's, not the task's
            with pytest.raises(UnsafeStateError) as caught:
                rt.journal.read_output_tail(task, 10)
            assert caught.value.rule == "permissive_mode"
            Path(state_dir, "tasks").chmod(0o700)

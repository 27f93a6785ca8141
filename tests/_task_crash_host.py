"""A task host that SIGKILLs itself after its k-th durable write (tests/e2e/test_tasks_crash.py).

``python tests/_task_crash_host.py STATE_DIR KILL_AT SESSIONS``: opens a ``TaskRuntime`` over
STATE_DIR (recovering whatever a killed run left), starts each session's user turn unless the
conversation already answered it, and waits until every task has ended and been handled.
Every durable write of the journal and the history (task records, session switches, message
appends) prints ``W <n> <who>``; after write number KILL_AT (0: never) the process kills
itself with SIGKILL - so a sweep over KILL_AT kills the host at every point of a turn.
KILL_AT may also be ``WHO@N``: after the N-th write made by ``WHO`` (the label's end). At the
end it prints ``DONE``.

A user's turn asks for three commands at once: one the tool starts in the background (its
end is notified), one the tool waits for and reports in its result (never notified), and a
hostile one that chmods its own capture file (it fails alone, and is notified).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from collections.abc import Sequence

import anyio

from afterword.disk import NoSyncDisk
from afterword.history import DurableHistory, Message, ToolCall
from afterword.store import RecordStore
from afterword.tasks import NOTIFICATION_KIND, TaskJournal, TaskRuntime, ToolResult, core, frame_output
from afterword.tasks.render import parse_notification

COMMANDS = {
    "background": "echo background-ok",
    "wait": "echo waited-ok",
    "hostile": 'chmod 644 "$(readlink /proc/$$/fd/1)"; echo hostile',
}
writes = 0
kill_at = 0
kill_who, kill_nth, seen_who = "", 0, 0


def caller() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("afterword.tasks") and not module.endswith(".journal"):
            name = frame.f_code.co_qualname
            if "<lambda>" not in name:
                return f"{module.rsplit('.', 1)[1]}.{name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "host"


def wrap(cls: type, name: str) -> None:
    original = getattr(cls, name)

    async def wrapper(self: object, *args: object, **kwargs: object) -> object:
        result = await original(self, *args, **kwargs)
        global writes, seen_who
        writes += 1
        label = f"{cls.__name__}.{name} {caller()}"
        print(f"W {writes} {label}", flush=True)
        seen_who += bool(kill_who) and label.endswith(kill_who)
        if writes == kill_at or (kill_who and seen_who == kill_nth):
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(cls, name, wrapper)


for cls, name in [
    (TaskJournal, "create"),
    (TaskJournal, "update_many"),
    (TaskJournal, "update_control"),
    (DurableHistory, "_append"),
]:
    wrap(cls, name)


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def model(session_id: str, context: Sequence[Message]) -> list[Message]:
    last = context[-1]
    if last.role == "user" and last.meta.get("kind") is None:
        calls = tuple(
            ToolCall(
                id=fresh("call"), name="run_and_wait" if kind == "wait" else "run", arguments=json.dumps(cmd)
            )
            for kind, cmd in COMMANDS.items()
        )
        return [Message(id=fresh("m"), role="assistant", content="", tool_calls=calls)]
    if last.meta.get("kind") == NOTIFICATION_KIND:
        task_id = parse_notification(last).task.task_id
        call = ToolCall(id=fresh("call"), name="read_output", arguments=json.dumps(task_id))
        return [Message(id=fresh("m"), role="assistant", content="", tool_calls=(call,))]
    return [Message(id=fresh("m"), role="assistant", content="ack")]


def tools(rt: TaskRuntime):  # type: ignore[no-untyped-def]
    async def execute(session_id: str, call: ToolCall) -> ToolResult:
        arg = json.loads(call.arguments)
        if call.name == "read_output":
            return ToolResult(content=frame_output(arg, rt.read_new_output(arg)))
        task = await rt.start_task(session_id, call, ["sh", "-c", arg])
        if call.name == "run":
            return ToolResult(content=f"started {task.task_id}")
        ended = await rt.supervisor.wait(task.task_id, 30)
        return ToolResult(content=f"{task.task_id} ended: {ended.state}", reported_terminal=(task.task_id,))

    return execute


def answered(messages: Sequence[Message], user_id: str) -> bool:
    ids = [m.id for m in messages]
    return user_id in ids and any(m.role == "assistant" for m in messages[ids.index(user_id) + 1 :])


def settled(rt: TaskRuntime, sessions: Sequence[str]) -> bool:
    for session in sessions:
        if rt.coordinator.busy(session):
            return False
        for task in rt.journal.tasks(session):
            if not core.is_terminal(task) or core.eligible(task):
                return False
            if task.delivered and not task.consumed:
                return False
    return True


async def main(state_dir: str, sessions: list[str]) -> None:
    with RecordStore.open(state_dir, disk=NoSyncDisk()) as store:
        async with (
            TaskRuntime.open(
                store, model, make_tools=tools, coalesce_window=0.02, retry_delay=lambda n: 0.05
            ) as rt,
            anyio.create_task_group() as tg,
        ):
            for session in sessions:
                user_id = f"{session}-u1"
                if not answered(await rt.history.latest(session, 500), user_id):
                    message = Message(id=user_id, role="user", content="run the three commands")
                    tg.start_soon(rt.user_turn, session, message)
            with anyio.fail_after(60):
                while True:
                    await anyio.sleep(0.02)
                    done = [answered(await rt.history.latest(s, 500), f"{s}-u1") for s in sessions]
                    if all(done) and settled(rt, sessions):
                        break
    print("DONE", flush=True)


if __name__ == "__main__":
    if "@" in sys.argv[2]:
        kill_who, nth = sys.argv[2].rsplit("@", 1)
        kill_nth = int(nth)
    else:
        kill_at = int(sys.argv[2])
    anyio.run(main, sys.argv[1], [f"s{i}" for i in range(int(sys.argv[3]))])

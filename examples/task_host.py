"""A runnable host for the task journal: a scripted model, a real background command.

What happens, all through ``TaskRuntime``:

1. the user asks for the tests; the model calls the ``run_in_background`` tool;
2. the host's tool executor starts a real command (``sh -c 'sleep 0.5; echo 3 passed'``) as a
   background task of that call and answers "started";
3. the model replies that the tests are running - the user's turn is over;
4. the command ends; its notification enters the conversation at a safe boundary;
5. the coordinator runs an automatic turn: the model reads the notification, calls the
   ``read_output`` tool (the tool loop runs inside the automatic turn), then reports;
6. the task is ``consumed``: the model handled it.

Run it (a temporary state directory is used unless ``--state-dir`` is given)::

    python examples/task_host.py

Message and tool call ids must be unique within a conversation (the history refuses a reused
one), so every id here carries a random part: running twice on one ``--state-dir`` continues
the same conversation with a second request.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import anyio

from afterword.history import Message, ToolCall
from afterword.store import RecordStore
from afterword.tasks import (
    NOTIFICATION_KIND,
    TaskRuntime,
    ToolExecutor,
    ToolResult,
    frame_output,
    parse_notification,
)

SESSION = "demo-session"
COMMAND = ["sh", "-c", "sleep 0.5; echo 3 passed"]


def say(text: str) -> None:
    print(text, flush=True)


class ScriptedModel:
    """Stands in for a real model: decides from the last message of its context."""

    def __init__(self) -> None:
        self.steps = 0
        self.run = uuid.uuid4().hex[:8]  # ids unique across runs on one state directory

    async def __call__(self, session_id: str, context: Sequence[Message]) -> list[Message]:
        self.steps += 1
        last, n = context[-1], f"{self.run}-{self.steps}"
        if last.meta.get("kind") == NOTIFICATION_KIND:
            task = parse_notification(last).task
            call = ToolCall(id=f"call-{n}", name="read_output", arguments=json.dumps({"task_id": task.task_id}))
            reply = Message(id=f"m{n}", role="assistant", content="", tool_calls=(call,))
        elif last.role == "user":
            call = ToolCall(id=f"call-{n}", name="run_in_background", arguments=json.dumps({"command": COMMAND}))
            reply = Message(id=f"m{n}", role="assistant", content="", tool_calls=(call,))
        elif last.role == "tool" and last.meta.get("tool_name") == "read_output":
            # The output arrives framed as untrusted data: a preamble, then one line of JSON.
            printed = json.loads(last.content.splitlines()[1])["untrusted_process_output"]["text"]
            reply = Message(id=f"m{n}", role="assistant", content=f"The tests finished: {printed.strip()}.")
        else:
            reply = Message(id=f"m{n}", role="assistant", content="The tests are running; I will report back.")
        for call in reply.calls():
            say(f"  model   -> tool call {call.name}({call.arguments})")
        if reply.content:
            say(f"  model   -> {reply.content}")
        return [reply]


def make_tools(runtime: TaskRuntime) -> ToolExecutor:
    async def execute(session_id: str, call: ToolCall) -> ToolResult:
        args = json.loads(call.arguments)
        if call.name == "run_in_background":
            task = await runtime.start_task(session_id, call, args["command"])
            say(f"  tool    -> started {task.task_id} (pid {task.pid}) in the background")
            return ToolResult(content=f"started task {task.task_id} in the background")
        if call.name == "read_output":
            # What the task printed since the last read, framed so the model treats it as data.
            chunk = runtime.read_new_output(args["task_id"])
            say(f"  tool    -> output of {args['task_id']}: {chunk.text.strip()!r}")
            return ToolResult(content=frame_output(args["task_id"], chunk))
        return ToolResult(content=f"unknown tool {call.name}", is_error=True)

    return execute


async def main(state_dir: str) -> int:
    with RecordStore.open(state_dir) as store:
        async with TaskRuntime.open(store, ScriptedModel(), make_tools=make_tools, on_exit="stop") as rt:
            say("user turn: 'please run the tests'")
            request = Message(id=f"u-{uuid.uuid4().hex}", role="user", content="please run the tests")
            turn = await rt.user_turn(SESSION, request)
            say(f"user turn done: {len(turn.steps)} model steps, {len(turn.tool_results)} tool result(s)")
            (call,) = turn.steps[0].replies[0].calls()
            (task,) = rt.processor.tasks_of_call(SESSION, call.id)
            with anyio.fail_after(30):
                # consumed is marked by the automatic turn's first step; wait for the whole turn
                while not rt.journal.require(task.task_id).consumed or rt.coordinator.busy(SESSION):
                    await anyio.sleep(0.02)
            done = rt.journal.require(task.task_id)
            say(f"task {done.task_id}: state={done.state} exit_code={done.exit_code} "
                f"committed={done.committed} delivered={done.delivered} consumed={done.consumed}")
            say("conversation:")
            for message in await rt.history.latest(SESSION, 50):
                kind = message.meta.get("kind") or message.role
                text = message.content.splitlines()[0][:70] if message.content else ""
                calls = ", ".join(c.name for c in message.calls())
                say(f"  {kind:<17} {text}{' [' + calls + ']' if calls else ''}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", default=None)
    args = parser.parse_args()
    if args.state_dir:
        sys.exit(anyio.run(main, args.state_dir))
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o700)
        sys.exit(anyio.run(main, str(Path(tmp) / "state")))

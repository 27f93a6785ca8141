"""A minimal agent host: one scripted turn that hands a long job to a trusted MCP server.

What a real host does around a model turn, with the model replaced by a script:

1. ``begin_run``: the host binds the run to the physical reply route it received from the
   channel (never from the model) and gets one claim capability per selected server;
2. it starts its MCP clients with the official SDK (2.x, or 1.x from 1.24); selected servers get the capability in
   their environment (stdio) or request headers (loopback HTTP), others get nothing;
3. the "model" calls ``start_job``; the server claims a continuation and answers "accepted";
4. the tool calls have settled, so the host settles the run: close the capability, bind the
   conversation snapshot (finalize), commit its own turn, activate;
5. later the server submits its result and afterword delivers one answer to the bound route.

Run against a config of your own (the service must not already be running on its port)::

    python examples/reference_host.py --config afterword.json --reply-to local:chat-1

A stdio server whose ``command`` is the bare name ``python`` or ``python3`` (as in
``examples/mcp.json``) is started with the interpreter running this host, so it sees the same
installed packages even when ``python3`` on ``PATH`` is another one (a venv not activated);
the host prints the substitution. ``--path-python`` keeps the ``PATH`` lookup instead.

``afterword demo`` runs this same host in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import anyio
import msgspec

import afterword
from afterword import ContinuationService
from afterword.config import Config
from afterword.mcp_host import Settlement, call_tool, connect_servers, sdk_line, settle_run, tool_outcome

Step = Callable[[str, str], None]
Message = dict[str, str]
TOOL_SERVER = "work-control"
TOOL_NAME = "start_job"


@dataclass
class TurnReport:
    """What one turn did, for display. Contains no credential."""

    run_id: str
    conversation_id: str
    reply_to: str
    tool_result: str
    tool_failed: bool
    assistant: str
    settlement: Settlement | None
    history: list[Message] = field(default_factory=list)


class ScriptedModel:
    """Stands in for the model: asks for one job, then words its reply from the tool result."""

    def plan(self, user_text: str) -> tuple[str, dict[str, Any]]:
        job = user_text.rstrip(".!?").removeprefix("Please ").strip() or "the requested job"
        return TOOL_NAME, {"job": job, "seconds": 1.0}

    def reply(self, tool_result: str, failed: bool) -> str:
        if failed:
            return f"I could not start that in the background ({tool_result})."
        return "I've started that in the background and will post the result here when it is done."


async def run_turn(
    service: ContinuationService,
    config: Config,
    *,
    conversation_id: str,
    reply_to: str,
    user_text: str,
    history: Sequence[Message] = (),
    model: ScriptedModel | Any = None,
    server: str = TOOL_SERVER,
    tasks: Any = None,
    on_step: Step = lambda _kind, _text: None,
    until: Callable[[Settlement], Awaitable[None]] | None = None,
    errlog: TextIO | None = None,
) -> TurnReport:
    """Run one agent turn and settle it.

    ``reply_to`` is the physical route the channel driver gave the host; ``conversation_id``
    may carry a history bucket (``...#2026-01-02``). ``until(settlement)``, when given, is
    awaited after the turn settled with the MCP clients still running, so a stdio server can
    finish its background job before the host stops it. ``server`` names the MCP server the
    model's tool is on (one of ``tools.continuationServers``); ``model`` may be any object with
    the ``plan``/``reply`` methods of ``ScriptedModel``. ``tasks``, a running
    ``afterword.mcp_host.TaskHost`` (SDK 2.x), lets the server answer with an MCP task handle,
    which is adopted as a continuation (docs/tasks-bridge.md).
    """
    model = model or ScriptedModel()
    run_id = "run-" + uuid.uuid4().hex[:10]
    binding = service.begin_run(run_id, conversation_id, reply_to)
    selected = ", ".join(binding.servers) or "no server"
    on_step("run", f"begin_run {run_id}: claim capability for {selected}, replies bound to {reply_to}")
    tool, arguments = model.plan(user_text)
    # read_timeout bounds each MCP response; the helpers take it on either SDK line.
    async with connect_servers(
        binding, config, [server], errlog=errlog, read_timeout=timedelta(seconds=60), tasks=tasks
    ) as sessions:
        entry = config.mcp_servers[server]
        how = "stdio subprocess" if entry.transport == "stdio" else f"streamable HTTP {entry.url}"
        on_step("mcp", f"{server} started via the MCP SDK {sdk_line()}.x ({how}) with the bound capability")
        on_step("tool", f"model calls {tool}({json.dumps(arguments)})")
        outcome = tool_outcome(await call_tool(sessions[server], tool, arguments))
        tool_text = outcome.text
        on_step("tool", f"{tool} returned: {tool_text}")
        assistant = model.reply(tool_text, outcome.failed)
        on_step("assistant", assistant)
        turn = [*history, {"role": "user", "content": user_text}, {"role": "assistant", "content": assistant}]
        committed: list[Message] = []

        async def commit() -> None:
            # A real host writes its conversation history and run status here, durably.
            committed.extend(turn)

        def on_phase(phase: str, s: Settlement) -> None:
            if phase == "closed":
                claims = ", ".join(s.active_claims) or "none"
                on_step("settle", f"tool calls settled; capability closed, active claims: {claims}")
            elif phase == "finalized" and s.snapshot_digest:
                on_step("settle", f"origin snapshot bound to the claims (blake3 {s.snapshot_digest[:16]}...)")
            elif phase == "committed":
                on_step("settle", "host committed its turn (history, run status)")
            elif phase == "activated":
                on_step("settle", "origin activated: the result may now be synthesized and delivered")

        settlement = await settle_run(binding, turn, commit=commit, on_phase=on_phase)
        if until is not None:
            await until(settlement)
    return TurnReport(
        run_id=run_id,
        conversation_id=conversation_id,
        reply_to=reply_to,
        tool_result=tool_text,
        tool_failed=outcome.failed,
        assistant=assistant,
        settlement=settlement,
        history=committed,
    )


def read_outbox(config: Config) -> list[dict[str, Any]]:
    """Lines delivered by the embedded outbox channel (``outbox.jsonl`` beside the config)."""
    path = Path(config.config_dir) / "outbox.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def wait_for_answer(config: Config, reply_to: str, *, timeout_s: float = 60.0) -> dict[str, Any]:
    with anyio.fail_after(timeout_s):
        while True:
            for line in read_outbox(config):
                if line["conversationId"] == reply_to:
                    return line
            await anyio.sleep(0.05)


# Bare interpreter names an MCP config writes to mean "a Python"; this host means its own.
HOST_PYTHON_NAMES = frozenset({"python", "python3"})


def with_host_python(config: Config, on_step: Step) -> Config:
    """``config`` with each stdio server run by ``python``/``python3`` run by ``sys.executable``.

    The MCP config is shared with other clients, so it keeps its portable ``python3``; only
    this host's view changes, and each substitution is reported through ``on_step``.
    """
    servers = dict(config.mcp_servers)
    for name, server in servers.items():
        if server.transport == "stdio" and server.command in HOST_PYTHON_NAMES:
            servers[name] = msgspec.structs.replace(server, command=sys.executable)
            on_step(
                "mcp", f"{name}: command {server.command!r} runs as this host's interpreter {sys.executable}"
            )
    return msgspec.structs.replace(config, mcp_servers=servers)


async def main(config_path: str, reply_to: str, text: str, *, path_python: bool = False) -> None:
    def on_step(kind: str, line: str) -> None:
        print(f"[{kind}] {line}")

    config = afterword.load_config(config_path)
    if not path_python:
        config = with_host_python(config, on_step)
    async with afterword.open_service(config) as service:
        answer: dict[str, Any] = {}

        async def until(_settlement: Settlement) -> None:
            answer.update(await wait_for_answer(config, reply_to))

        await run_turn(
            service,
            config,
            conversation_id=reply_to,
            reply_to=reply_to,
            user_text=text,
            on_step=on_step,
            until=until,
        )
        print(f"[later answer -> {answer['conversationId']}] {answer['text']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run one scripted agent turn against afterword.")
    parser.add_argument("--config", required=True)
    parser.add_argument("--reply-to", default="local:chat-1")
    parser.add_argument("--text", default="Please rebuild the search index")
    parser.add_argument(
        "--path-python",
        action="store_true",
        help="start servers whose command is python/python3 with the one on PATH, not this interpreter",
    )
    args = parser.parse_args()
    anyio.run(lambda: main(args.config, args.reply_to, args.text, path_python=args.path_python))

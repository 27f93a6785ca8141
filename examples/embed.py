"""Embedding afterword in your own agent host: the app handle, one run, one later answer.

Run it as is (it makes a throwaway configuration in a temporary directory, so nothing is left
behind) or against your configuration::

    python examples/embed.py
    python examples/embed.py --config path/to/afterword.json --reply-to local:chat-1

What a host does around one model turn, step by step:

1. ``open_service(config)`` opens the state directory, recovers, and starts the HTTP service
   and the worker in this process (leaving the ``async with`` shuts them down cleanly);
2. ``service.begin_run(run_id, conversation_id, reply_to=...)`` binds the run to the route
   the *channel* gave you (never one the model chose) and returns a ``RunBinding``;
3. start your MCP servers with ``binding.stdio_env(name, base_env)`` as their environment (or
   ``binding.http_headers(name, base_headers)`` for a loopback HTTP server): a selected server
   finds its claim capability there. Here the tool server is simulated in-process by
   ``fake_tool_call``, which claims exactly as ``afterword.producer`` does inside a real server;
4. when the turn's tool calls have settled: ``await binding.close()``, then
   ``await binding.finalize(history)``, commit your own turn, then ``await binding.activate()``
   (if anything fails before your commit: ``await binding.abandon()``);
5. the tool finishes later and submits its result; afterword writes one answer and delivers it
   to ``reply_to``.

``history`` is the retained conversation of the exact bucket ``conversation_id`` names,
oldest first: a sequence of ``{"role": "user" | "assistant", "content": str}`` that ends with
this turn's user message and your assistant reply. afterword snapshots it (at most 64
messages, 256 KiB; whole oldest turns are dropped first) so the later answer is written from
the conversation as it was, not as it is later.

Where the answer goes: the channel that ``continuations.channels`` maps to the first segment of
``reply_to``. With no channels block, that is the outbox, ``outbox.jsonl`` beside the config
file (one JSON line per delivered message), which this example reads back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio

import afterword
from afterword import ContinuationService
from afterword.config import Config
from afterword.producer import ClaimCapability, Producer, task_hash

SERVER = "work-control"  # the MCP server (in tools.continuationServers) that may claim


def throwaway_config(folder: Path) -> Path:
    """A minimal configuration: one selected stdio server, a free port, the default outbox."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (folder / "mcp.json").write_text(json.dumps({"mcpServers": {SERVER: {"command": "true"}}}))
    config = {
        "tools": {"mcpConfigPath": "mcp.json", "continuationServers": [SERVER]},
        "continuations": {"port": port},
    }
    path = folder / "afterword.json"
    path.write_text(json.dumps(config, indent=2))
    return path


async def fake_tool_call(env: dict[str, str], job: str) -> tuple[Producer, Any]:
    """What the selected MCP server does during its tool call: claim, then answer "accepted"."""
    capability = ClaimCapability.from_env(env)
    producer = Producer()
    handle = await producer.claim(
        capability, task_key="job-" + job.replace(" ", "-"), task_hash=task_hash({"job": job}), deadline=timedelta(hours=1)
    )
    return producer, handle


def outbox_lines(config: Config) -> list[dict[str, Any]]:
    outbox = Path(config.config_dir) / "outbox.jsonl"
    if not outbox.exists():
        return []
    return [json.loads(line) for line in outbox.read_text().splitlines() if line.strip()]


async def run(config: Config, reply_to: str) -> dict[str, Any]:
    async with afterword.open_service(config) as service:
        answer = await one_turn(service, config, reply_to)
        print(f"health: {service.continuation_health().status}")
        return answer


async def one_turn(service: ContinuationService, config: Config, reply_to: str) -> dict[str, Any]:
    conversation_id = f"{reply_to}#2026-12-01"  # a history bucket of that route (daily rollover)
    binding = service.begin_run("run-42", conversation_id, reply_to=reply_to)
    base_env = {"PATH": os.environ.get("PATH", "")}
    env = binding.stdio_env(SERVER, base_env)  # what you pass when spawning the MCP server
    print(f"1. begin_run: capability for {SERVER} in MONO_AGENT_CONTINUATION_CLAIM_* ({len(env)} vars)")

    producer, handle = await fake_tool_call(env, "rebuild the search index")
    print(f"2. the tool claimed {handle.continuation_id} and answered 'accepted'")

    history = [
        {"role": "user", "content": "Please rebuild the search index."},
        {"role": "assistant", "content": "Started; I will post here when it is done."},
    ]
    await binding.close()
    await binding.finalize(history)
    # ... commit your own turn (conversation history, run status) durably here ...
    await binding.activate()
    print("3. run settled: closed, snapshot bound, turn committed, activated")

    async with producer:
        await handle.submit_result({"summary": "the index has 42,017 documents"}, idempotency_key="result-1")
        print("4. the tool submitted its result")
        with anyio.fail_after(30):  # the tool may follow its status URL until the answer is out
            while (await handle.status()).state != "delivered":
                await anyio.sleep(0.05)
    lines = [x for x in outbox_lines(config) if x["conversationId"] == reply_to]
    print(f"5. delivered to {reply_to} via {Path(config.config_dir) / 'outbox.jsonl'}: {lines[0]['text']}")
    return lines[0]


def main() -> int:
    parser = argparse.ArgumentParser(description="Embed afterword and run one turn with a later answer.")
    parser.add_argument("--config", help="your afterword.json (default: a throwaway one in a temp dir)")
    parser.add_argument("--reply-to", default="local:chat-1", help="the physical route to answer on")
    args = parser.parse_args()
    if args.config:
        anyio.run(run, afterword.load_config(args.config), args.reply_to)
        return 0
    with tempfile.TemporaryDirectory(prefix="afterword-embed-") as tmp:
        anyio.run(run, afterword.load_config(throwaway_config(Path(tmp))), args.reply_to)
    return 0


if __name__ == "__main__":
    sys.exit(main())

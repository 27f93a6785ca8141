"""The close/claim race, with a deliberately slow tool in a real stdio MCP server.

The host closes the run's capability when its tool calls settle. Two orderings matter:

* the slow tool only tries to claim after the close: the claim is refused (410) and nothing
  is created, so no late continuation can wait forever for an origin that already settled;
* the claim was already admitted but not yet committed when the host closes: ``close()``
  waits for it, and returns it as active, so the host binds its snapshot.

The tool waits on gate files the test controls, so the orderings are forced, not timed.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from _service import ENV, load, write_config

import afterword
from afterword.mcp_host import connect_servers, settle_run, tool_outcome

WAIT_S = 30.0
SLOW_SERVER = textwrap.dedent(
    """
    import os
    from datetime import timedelta
    from pathlib import Path

    import anyio

    try:
        from mcp.server.mcpserver import Context, MCPServer
    except ImportError:  # SDK 1.x
        from mcp.server.fastmcp import Context, FastMCP as MCPServer

    from afterword.producer import CapabilityClosed, ClaimCapability, Producer, task_hash

    server = MCPServer("slow", log_level="WARNING")


    @server.tool()
    async def slow_claim(gate: str, ctx: Context) -> str:
        Path(gate + ".waiting").touch()
        while not os.path.exists(gate):  # deliberately slow: the test decides when to go on
            await anyio.sleep(0.01)
        async with Producer() as producer:
            try:
                handle = await producer.claim(
                    ClaimCapability.from_mcp_context(ctx),
                    task_key="slow-" + Path(gate).name,
                    task_hash=task_hash(gate),
                    deadline=timedelta(hours=1),
                )
            except CapabilityClosed as exc:
                return f"closed: {exc}"
        return f"accepted {handle.continuation_id}"


    server.run("stdio")
    """
)
HISTORY = [{"role": "user", "content": "slow job"}, {"role": "assistant", "content": "on it"}]


def text_of(result: Any) -> str:
    return tool_outcome(result).text


async def wait_file(path: Path) -> None:
    with anyio.fail_after(WAIT_S):
        while not path.exists():
            await anyio.sleep(0.01)


def setup(tmp_path: Path) -> afterword.Config:
    script = tmp_path / "slow_server.py"
    script.write_text(SLOW_SERVER)
    servers = {"slow": {"command": sys.executable, "args": [str(script)]}}
    return load(write_config(tmp_path, servers=servers, selected=["slow"]))


@pytest.mark.anyio
async def test_a_claim_after_close_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    config = setup(tmp_path)
    gate = tmp_path / "gate-late"
    async with afterword.open_service(config, environ=ENV, run_worker=False) as service:
        binding = service.begin_run("run-late", "local:chat", "local:chat")
        async with connect_servers(binding, config, ["slow"]) as sessions:
            outcome: dict[str, str] = {}

            async def call() -> None:
                result = await sessions["slow"].call_tool("slow_claim", {"gate": str(gate)})
                outcome["text"] = text_of(result)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await wait_file(Path(str(gate) + ".waiting"))  # the tool call is in progress
                # The host gives up on the call (its turn ends) and settles.
                settlement = await settle_run(binding, HISTORY)
                gate.touch()  # only now does the slow tool try to claim
        assert settlement.active_claims == () and settlement.snapshot_digest is None
        assert outcome["text"].startswith("closed:"), outcome
        assert service.list_continuations().items == []
        assert service.continuation_health().status == "healthy"


@pytest.mark.anyio
async def test_close_waits_for_a_claim_already_being_admitted(tmp_path: Path) -> None:
    config = setup(tmp_path)
    gate = tmp_path / "gate-early"
    gate.touch()  # the tool claims at once
    async with afterword.open_service(config, environ=ENV, run_worker=False) as service:
        admitting = anyio.Event()
        release = anyio.Event()

        async def hold_commit() -> None:
            admitting.set()
            await release.wait()

        service.hooks.before_claim_commit = hold_commit
        binding = service.begin_run("run-early", "local:chat", "local:chat")
        async with connect_servers(binding, config, ["slow"]) as sessions:
            outcome: dict[str, object] = {}

            async def call() -> None:
                result = await sessions["slow"].call_tool("slow_claim", {"gate": str(gate)})
                outcome["text"] = text_of(result)

            async def close() -> None:
                outcome["closed"] = await binding.close()

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                with anyio.fail_after(WAIT_S):
                    await admitting.wait()  # admitted, not yet committed
                tg.start_soon(close)
                await anyio.wait_all_tasks_blocked()  # close() ran as far as it can
                assert "closed" not in outcome  # close() is draining the admitted claim
                release.set()
        text = str(outcome["text"])
        assert text.startswith("accepted "), text
        cid = text.split()[1]
        assert outcome["closed"] == [cid]
        await binding.finalize(HISTORY)
        await binding.activate()
        (item,) = service.list_continuations().items
        assert (item.continuation_id, item.state, item.origin_context) == (cid, "claimed", "pinned")

"""``afterword demo --tasks``: an MCP Tasks server's answer delivered through a continuation.

Nothing is simulated but the model. ``examples/tasks_server.py`` (written on the MCP Python
SDK 2.x extension API, no afterword code in it) runs on loopback streamable HTTP; the
reference host calls its ``write_report`` tool with the tasks extension declared, gets a task
handle and adopts it (``follow: "service"``); the run settles; afterword's worker polls
``tasks/get`` until the task completes, then synthesizes and delivers the answer. The demo
prints each lifecycle step and the delivered answer, and checks it was delivered exactly once.

The server needs only the ``mcp`` extra, on the SDK 2.x line (the Tasks extension is a
2026-07-28 feature); on 1.x the demo says so and exits 2.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import msgspec
from rich.console import Console

from ..clients.mcp_sessions import Settlement, TaskHost
from ..config import Config, load_config
from ..runtime import open_service
from .demo import (
    EXAMPLES,
    WAIT_S,
    DemoError,
    Display,
    _load_example,
    _port,
    _port_taken,
    _show_delivery,
    _show_health,
)

SERVER = "report-tasks"
FOLLOW = "service"
CONVERSATION = "demo:chat-7"


def _sdk_major() -> int:
    from importlib.metadata import version

    return int(version("mcp").split(".")[0])


def _write_config(root: Path, port: int, tasks_url: str | None) -> Path:
    """The example server on loopback HTTP (the service follows its task) or, without a URL,
    spawned over stdio by the host (the host's TaskHost follows it while the demo runs)."""
    entry: dict[str, Any] = (
        {"url": tasks_url}
        if tasks_url is not None
        else {"command": sys.executable, "args": [str(EXAMPLES / "tasks_server.py")]}
    )
    mcp = {"mcpServers": {SERVER: entry}}
    config = {
        "tools": {"mcpConfigPath": "./mcp.json", "continuationServers": [SERVER]},
        "continuations": {"port": port},
    }
    (root / "mcp.json").write_bytes(msgspec.json.format(msgspec.json.encode(mcp)))
    path = root / "afterword.json"
    path.write_bytes(msgspec.json.format(msgspec.json.encode(config)))
    return path


def _start_server(root: Path, port: int) -> subprocess.Popen[bytes]:
    """The example Tasks server on loopback HTTP; fails with a DemoError if it does not listen."""
    log = (root / "report-tasks.log").open("ab")
    try:
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / "tasks_server.py"), "--http", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={k: v for k, v in os.environ.items() if not k.startswith(("AFTERWORD_", "MONO_AGENT_"))},
        )
    finally:
        log.close()
    give_up = time.monotonic() + WAIT_S
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            raise DemoError(f"the Tasks server exited with {proc.returncode}")
        try:  # a TCP connect: a GET on /mcp would open the server's event stream
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise DemoError("the Tasks server did not listen")


class ReportModel:
    """Stands in for the model: asks for one report, then words its reply from the tool result."""

    def plan(self, user_text: str) -> tuple[str, dict[str, Any]]:
        return "write_report", {"topic": "last night's backups", "seconds": 1.0}

    def reply(self, tool_result: str, failed: bool) -> str:
        if failed:
            return f"I could not start the report ({tool_result})."
        return "The report is being written in the background; I will post it here when it is ready."


def _delivered_lines(config: Config, cid: str) -> int:
    path = Path(config.config_dir) / "outbox.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(1 for line in lines if msgspec.json.decode(line)["deliveryKey"].startswith(cid + ":"))


async def _turn(
    config: Config, service: Any, display: Display, root: Path, host: ModuleType, tasks: Any
) -> None:
    seen: list[str] = []

    async def until(settlement: Settlement) -> None:
        # A service-followed task needs nothing more from the host; the demo waits for the
        # answer only to show it.
        seen.extend(cid for cid in settlement.active_claims if cid not in seen)
        for cid in seen:
            rec = service.repo.get(cid)
            follow = rec.task.follow if rec is not None and rec.task is not None else "nobody"
            who = "afterword polls tasks/get itself" if follow == "service" else "the host polls tasks/get"
            display.step("task", f"{cid}: task-backed continuation, followed by the {follow} ({who})")
        for cid in seen:
            await display.wait(cid)

    with (root / "host-mcp.log").open("w") as errlog:
        report = await host.run_turn(
            service,
            config,
            conversation_id=CONVERSATION,
            reply_to=CONVERSATION,
            user_text="Please write the report on last night's backups",
            model=ReportModel(),
            server=SERVER,
            tasks=tasks,
            on_step=display.step,
            until=until,
            errlog=errlog,
        )
    if report.tool_failed or not seen:
        raise DemoError(f"the task was not adopted: {report.tool_result}")
    for cid in seen:
        rec = display.finished[cid]
        _show_delivery(display, config, rec)
        count = _delivered_lines(config, cid)
        if count != 1:
            raise DemoError(f"{cid} was delivered {count} times")
        display.step("once", f"{cid}: the task's answer was delivered exactly once")


async def run_tasks_demo(keep: bool, *, console: Console | None = None, follow: str = FOLLOW) -> int:
    """Run the Tasks demo; the exit code (0: delivered once and healthy, 2: cannot run here).
    ``follow``: ``service`` (the server on loopback HTTP) or ``host`` (over stdio)."""
    console = console or Console(highlight=False, soft_wrap=True)
    if _sdk_major() < 2:
        console.print(
            "afterword demo --tasks: MCP Tasks need the MCP Python SDK 2.x (the 2026-07-28 "
            "revision); this environment has 1.x. pip install 'mcp>=2.3,<3' to run it."
        )
        return 2
    if not (EXAMPLES / "tasks_server.py").is_file():
        console.print(f"afterword demo --tasks: {EXAMPLES}/tasks_server.py is missing")
        return 2
    host = _load_example("reference_host")
    root = Path(tempfile.mkdtemp(prefix="afterword-demo-tasks-"))  # created 0700
    display = Display(console)
    server: subprocess.Popen[bytes] | None = None
    try:
        tasks_url: str | None = None
        if follow == "service":
            tasks_port = _port(False)
            server = _start_server(root, tasks_port)
            tasks_url = f"http://127.0.0.1:{tasks_port}/mcp"
            display.step("mcp", f"{SERVER} (examples/tasks_server.py) serves MCP Tasks at {tasks_url}")
        async with AsyncExitStack() as stack:
            for attempt in range(3):
                path = _write_config(root, _port(attempt == 0), tasks_url)
                config = load_config(path)
                try:
                    service = await stack.enter_async_context(open_service(config))
                    break
                except Exception as exc:
                    if not _port_taken(exc):
                        raise
            else:
                raise DemoError("could not listen on a loopback port")
            display.step("config", f"{path}: service on {config.base_url}, outbox {root}/outbox.jsonl")
            service.on_change.append(display.on_change)
            tasks = await stack.enter_async_context(TaskHost(service))
            await _turn(config, service, display, root, host, tasks)
            status = _show_health(display, service)
        return 0 if status == "healthy" else 1
    except DemoError as exc:
        console.print(f"afterword demo --tasks: {exc} (logs in {root})")
        return 1
    finally:
        if server is not None:
            server.terminate()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(server.wait)
        if keep:
            console.print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

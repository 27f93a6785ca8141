"""``afterword demo``: the whole flow, for real, in a temporary directory.

Nothing is simulated except the model: the real service (store, HTTP on loopback, worker),
the example MCP server spawned over stdio by the official SDK client with the capability in
its environment, and the reference host running one scripted turn and settling it. Each
lifecycle step is printed as it happens; then the delivered answer, its receipt and the
health. A detached claim on a named route follows, as a deterministic service would make it.

The example server and reference host live in ``examples/`` of the source checkout, which is
where an editable install (``pip install -e '.[mcp]'``) runs from. They need the MCP SDK (the
``mcp`` extra, either SDK line); ``afterword demo`` without it says so and exits 2.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import msgspec
from rich.console import Console

from ..app.service import ContinuationService
from ..clients.mcp_sessions import Settlement
from ..clients.producer import Producer, task_hash
from ..config import DEFAULT_PORT, Config, load_config
from ..continuations.model import Continuation
from ..errors import AfterwordError
from ..http.server import ServeError
from ..protocol.views import status_body
from ..runtime import open_service

# A built wheel carries the examples as afterword/examples (see setup.py); a source checkout
# (an editable install) has them beside the package.
_PACKAGE = Path(__file__).resolve().parent.parent
_PACKAGED = _PACKAGE / "examples"
EXAMPLES = _PACKAGED if (_PACKAGED / "work_control_server.py").exists() else _PACKAGE.parent / "examples"
DETACHED_SERVICE = "nightly-audit"
DETACHED_TOKEN_ENV = "AFTERWORD_DEMO_DETACHED_TOKEN"
CONVERSATION = "demo:chat-42"
DIGEST_ROUTE_TARGET = "demo:ops-digest"
WAIT_S = 60.0
_TERMINAL = {"delivered", "delivery_unknown", "expired", "cancelled", "dead_lettered"}


class DemoError(AfterwordError):
    """The demo could not run or did not reach its end; the message says where."""


def _port(prefer_default: bool) -> int:
    """The documented default port when it is free, else any free loopback port."""
    for port in (DEFAULT_PORT, 0) if prefer_default else (0,):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise DemoError("no free loopback port")


def _port_taken(exc: BaseException) -> bool:
    # open_service raises ServeError from inside its task group, which wraps it in a group.
    if isinstance(exc, BaseExceptionGroup):
        return all(_port_taken(e) for e in exc.exceptions)
    return isinstance(exc, ServeError)


def _load_example(name: str) -> ModuleType:
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"afterword_example_{name}", path)
    if spec is None or spec.loader is None:
        raise DemoError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _write_config(root: Path, port: int) -> Path:
    """Only what the demo needs beyond the embedded defaults: the server, a free port, one
    named route and one detached service. Channels default to ``outbox.jsonl`` beside it."""
    mcp = {
        "mcpServers": {
            "work-control": {"command": sys.executable, "args": [str(EXAMPLES / "work_control_server.py")]}
        }
    }
    config = {
        "tools": {"mcpConfigPath": "./mcp.json", "continuationServers": ["work-control"]},
        "continuations": {
            "port": port,
            "namedRoutes": {
                "daily-attention": {"mode": "notify_if_actionable", "conversationId": DIGEST_ROUTE_TARGET}
            },
            "detachedServices": [{"name": DETACHED_SERVICE, "tokenEnv": DETACHED_TOKEN_ENV}],
        },
    }
    (root / "mcp.json").write_bytes(msgspec.json.format(msgspec.json.encode(mcp)))
    path = root / "afterword.json"
    path.write_bytes(msgspec.json.format(msgspec.json.encode(config)))
    return path


class Display:
    """One line per lifecycle step, with the time since the demo started."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._t0 = time.monotonic()
        self._last: dict[str, tuple[str, str]] = {}
        self.finished: dict[str, Continuation] = {}
        self._events: dict[str, anyio.Event] = {}

    def step(self, kind: str, text: str) -> None:
        elapsed = time.monotonic() - self._t0
        self.console.print(f"[dim]{elapsed:6.2f}s[/] [bold cyan]{kind:<8}[/] {text}", highlight=False)

    def on_change(self, old: Continuation | None, new: Continuation) -> None:
        """Service hook: print each state or origin-context change of a continuation."""
        seen = (new.state, new.origin_context)
        if self._last.get(new.id) == seen:
            return
        self._last[new.id] = seen
        what = "claimed" if old is None else new.state
        self.step("state", f"{new.id}: {what} (origin {new.origin_context}, mode {new.claim.mode})")
        if new.state in _TERMINAL:
            self.finished[new.id] = new
            self.event(new.id).set()

    def event(self, cid: str) -> anyio.Event:
        return self._events.setdefault(cid, anyio.Event())

    async def wait(self, cid: str) -> Continuation:
        with anyio.move_on_after(WAIT_S):
            await self.event(cid).wait()
        if cid not in self.finished:
            raise DemoError(f"continuation {cid} did not finish within {WAIT_S:g}s")
        return self.finished[cid]


def _answer(config: Config, cid: str) -> dict[str, Any]:
    path = Path(config.config_dir) / "outbox.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        item = msgspec.json.decode(line)
        if item["deliveryKey"].startswith(cid + ":"):
            return dict(item)
    raise DemoError(f"no outbox line for {cid}")


def _show_delivery(display: Display, config: Config, rec: Continuation) -> None:
    console = display.console
    if rec.state != "delivered":
        raise DemoError(f"continuation {rec.id} ended {rec.state}")
    line = _answer(config, rec.id)
    console.print(f"\n[bold]Delivered to {line['conversationId']}:[/]", highlight=False)
    console.print(f"  {line['text']}", highlight=False)
    receipt = status_body(rec).receipt
    console.print("[bold]Receipt:[/]", highlight=False)
    console.print(msgspec.json.format(msgspec.json.encode(receipt), indent=2).decode(), highlight=False)
    console.print()


async def _interactive(
    service: ContinuationService, config: Config, display: Display, root: Path, host: ModuleType
) -> None:
    cids: list[str] = []

    async def until(settlement: Settlement) -> None:
        # The stdio server keeps running until the answer is delivered, as a real host keeps
        # its MCP servers up; then the SDK client stops it.
        cids.extend(settlement.active_claims)
        for cid in cids:
            await display.wait(cid)

    with (root / "work-control.log").open("w") as errlog:
        report = await host.run_turn(
            service,
            config,
            conversation_id=f"{CONVERSATION}#{time.strftime('%Y-%m-%d', time.gmtime())}",
            reply_to=CONVERSATION,
            user_text="Please rebuild the search index",
            on_step=display.step,
            until=until,
            errlog=errlog,
        )
    if report.tool_failed or not cids:
        raise DemoError(f"the tool did not accept the job: {report.tool_result}")
    for cid in cids:
        _show_delivery(display, config, display.finished[cid])


async def _detached(service: ContinuationService, config: Config, display: Display, token: str) -> None:
    display.step("detached", f"{DETACHED_SERVICE} claims on named route daily-attention (no interactive run)")
    task = {"audit": "certificates", "window_days": 14}
    async with Producer() as producer:
        handle = await producer.detached_claim(
            config.base_url,
            service_name=DETACHED_SERVICE,
            token=token,
            route="daily-attention",
            task_key="audit-certificates-1",
            task_hash=task_hash(task),
            deadline=timedelta(hours=1),
        )
        payload = {"actionable": True, "summary": "2 TLS certificates expire within 14 days: api, billing."}
        status = await handle.submit_result(payload, idempotency_key="audit-certificates-1-result")
        display.step("detached", f"result submitted: {handle.continuation_id} is {status.state}")
        rec = await display.wait(handle.continuation_id)
    _show_delivery(display, config, rec)


def _show_health(display: Display, service: ContinuationService) -> str:
    health = service.continuation_health()
    counts = ", ".join(f"{k} {v}" for k, v in sorted(health.counts.items())) or "no continuations"
    display.console.print(
        f"[bold]Health:[/] {health.status} ({counts}; active {health.active})", highlight=False
    )
    return health.status


async def run_demo(keep: bool, *, console: Console | None = None) -> int:
    """Run the demo; returns the process exit code (0: both answers delivered, healthy)."""
    console = console or Console(highlight=False, soft_wrap=True)
    if not (EXAMPLES / "work_control_server.py").is_file():
        console.print(
            f"afterword demo: {EXAMPLES} is missing; the demo runs from a source checkout "
            "(git clone ... && pip install -e '.[mcp]' && afterword demo)"
        )
        return 2
    host = _load_example("reference_host")
    root = Path(tempfile.mkdtemp(prefix="afterword-demo-"))  # created 0700
    display = Display(console)
    token = secrets.token_urlsafe(24)
    environ = {**os.environ, DETACHED_TOKEN_ENV: token}
    try:
        async with AsyncExitStack() as stack:
            for attempt in range(3):
                # The port is free when picked, but another process may take it first.
                config = load_config(_write_config(root, _port(attempt == 0)), environ=environ)
                try:
                    service = await stack.enter_async_context(open_service(config, environ=environ))
                    break
                except Exception as exc:
                    if not _port_taken(exc):
                        raise
            else:
                raise DemoError("could not listen on a loopback port")
            display.step(
                "config", f"{root}/afterword.json: service on {config.base_url}, outbox {root}/outbox.jsonl"
            )
            service.on_change.append(display.on_change)
            display.step("service", f"open: state in {config.state_dir}, worker running")
            await _interactive(service, config, display, root, host)
            await _detached(service, config, display, token)
            status = _show_health(display, service)
        return 0 if status == "healthy" else 1
    except DemoError as exc:
        console.print(f"afterword demo: {exc} (server log: {root}/work-control.log)")
        return 1
    finally:
        if keep:
            console.print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(anyio.run(run_demo, False))

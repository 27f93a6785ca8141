"""The host side of the MCP Tasks bridge against a real Tasks server on the SDK 2.x extension API
(tests/tasks_servers/host_tasks_server.py), over stdio and over loopback HTTP.

Adoption and reporting are the service's (tests/e2e/test_mcp_tasks_host_e2e.py drives them for
real); here a recording binding and reporter stand in, so each host-side rule can be seen on
its own: what the servers received, what the model reads, what was polled, reported, cancelled.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from _service import free_port, load, write_config
from test_mcp_e2e import wait_port

from afterword.clients.hostapi_client import HostApiError
from afterword.clients.mcp_sdk import installed_line
from afterword.config import Config
from afterword.continuations import errors as E
from afterword.protocol.tasks import AdoptedTask, TaskHandle, TaskOutcome, TaskReport

pytestmark = pytest.mark.skipif(
    installed_line() != 2,
    reason="the MCP tasks extension needs the SDK 2.x client extension API; 1.x declares nothing",
)

if installed_line() == 2:
    from afterword.mcp_host import TaskHost, call_tool, connect_servers, tool_outcome

SERVER = str(Path(__file__).resolve().parents[1] / "tasks_servers" / "host_tasks_server.py")
WAIT_S = 30.0


@dataclass
class Binding:
    """A run binding that adopts into a list (the service's adopt_task is tested end to end)."""

    follow: str = "host"
    refuse: E.ContinuationError | None = None
    blinks: int = 0  # adoptions that fail as unreachable before one goes through
    servers: list[str] = field(default_factory=lambda: ["work-control"])
    adopted: list[tuple[str, TaskHandle]] = field(default_factory=list)

    def stdio_env(self, server: str, base: Any = None) -> dict[str, str]:
        return dict(base or {})

    def http_headers(self, server: str, base: Any = None) -> dict[str, str]:
        return dict(base or {})

    async def adopt_task(self, server: str, handle: TaskHandle) -> AdoptedTask:
        if self.refuse is not None:
            raise self.refuse
        if self.blinks:
            self.blinks -= 1
            raise HostApiError(0, "unreachable", "cannot reach the service (ConnectError)")
        self.adopted.append((server, handle))
        return AdoptedTask(continuation_id=f"c_{len(self.adopted)}", follow=self.follow)  # type: ignore[arg-type]


@dataclass
class Reporter:
    """Records reports; answers ``cancel`` once asked to, like the service after a cancel."""

    cancel: bool = False
    broken: str | None = None  # a continuation whose reports raise an unexpected error
    reports: list[tuple[str, TaskOutcome]] = field(default_factory=list)

    async def report_task_outcome(self, cid: str, outcome: TaskOutcome) -> TaskReport:
        if cid == self.broken:
            raise RuntimeError("a bug on the reporting side")
        self.reports.append((cid, outcome))
        if self.cancel:
            return TaskReport(state="cancelled", cancel=True)
        state = "claimed" if outcome.status == "working" else "result_received"
        return TaskReport(state=state, cancel=False)


@dataclass
class World:
    """The servers' shared files, and this test's prefix: every key a test uses starts with it,
    so tests sharing one HTTP server read only their own records."""

    root: Path
    config: Config
    prefix: str

    def key(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def records(self, server: str) -> list[dict[str, Any]]:
        path = self.root / f"{server}.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [r for r in lines if str(r.get("key") or r["args"].get("key", "")).startswith(self.prefix)]

    def open_gate(self, key: str, text: str = "ok") -> None:
        (self.root / "gates" / self.key(key)).write_text(text)


def server_args(root: Path, name: str) -> list[str]:
    return [SERVER, "--record", str(root / f"{name}.jsonl"), "--gates", str(root / "gates")]


@pytest.fixture(scope="module")
def http_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Both servers over loopback HTTP, started once for the module (stateless: each request
    stands alone, so tests only share the process)."""
    root = tmp_path_factory.mktemp("http-servers")
    (root / "gates").mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    servers: dict[str, Any] = {}
    try:
        for name in ("work-control", "plain"):
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, *server_args(root, name), "--http", "--port", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(proc)
            wait_port(proc, port)
            servers[name] = {"url": f"http://127.0.0.1:{port}/mcp"}
        yield root, servers
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture(params=["stdio", "http"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> World:
    """Two servers from the same script: "work-control" (selected) and "plain" (not)."""
    prefix = request.node.name.replace("[", "-").replace("]", "")
    if request.param == "http":
        root, servers = request.getfixturevalue("http_servers")
    else:
        root = tmp_path
        (root / "gates").mkdir()
        servers = {
            name: {"command": sys.executable, "args": server_args(root, name)}
            for name in ("work-control", "plain")
        }
    return World(root, load(write_config(tmp_path, servers=servers)), prefix)


@asynccontextmanager
async def turn(
    world: World, binding: Binding, tasks: TaskHost | None, names: tuple[str, ...] = ("work-control",)
) -> AsyncIterator[dict[str, Any]]:
    async with connect_servers(binding, world.config, list(names), tasks=tasks) as sessions:  # type: ignore[arg-type]
        yield sessions


async def until(check: Any) -> None:
    with anyio.fail_after(WAIT_S):
        while not check():
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_the_extension_is_declared_to_selected_servers_only(world: World) -> None:
    binding, reporter = Binding(follow="service"), Reporter()
    async with (
        TaskHost(reporter) as tasks,
        turn(world, binding, tasks, ("work-control", "plain")) as sessions,
    ):
        selected = tool_outcome(
            await call_tool(sessions["work-control"], "job", {"key": world.key("a"), "text": "reindex"})
        )
        plain = tool_outcome(
            await call_tool(sessions["plain"], "job", {"key": world.key("b"), "text": "backup"})
        )
    assert [r["declared"] for r in world.records("work-control")] == [True]
    assert [r["declared"] for r in world.records("plain")] == [False]
    # The selected server answered with a task, adopted for this run; the other ran inline.
    assert not selected.failed and "will follow in this conversation" in selected.text
    assert "continuation c_1" in selected.text
    assert plain == tool_outcome(plain_result("backup ran inline"))
    ((server, handle),) = binding.adopted
    assert server == "work-control" and handle.status == "working" and handle.ttl_ms == 3_600_000
    # The model never reads the server's task id (it may be all a caller needs to read the task).
    assert handle.task_id not in selected.text
    # follow "service": the host polls nothing and reports nothing.
    assert reporter.reports == [] and "tasks/get" not in {r["method"] for r in world.records("work-control")}


def plain_result(text: str) -> Any:
    from mcp import types

    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


@pytest.mark.anyio
async def test_without_a_task_host_nothing_is_declared(world: World) -> None:
    binding = Binding()
    async with turn(world, binding, None) as sessions:
        outcome = tool_outcome(
            await call_tool(sessions["work-control"], "job", {"key": world.key("a"), "text": "x"})
        )
    assert outcome.text == "x ran inline" and binding.adopted == []
    assert [r["declared"] for r in world.records("work-control")] == [False]


MALFORMED = ("no_id", "control", "status", "long", "poll")


@pytest.mark.anyio
async def test_a_malformed_handle_is_a_tool_error_and_nothing_is_adopted(world: World) -> None:
    binding, reporter = Binding(), Reporter()
    outcomes = {}
    async with TaskHost(reporter) as tasks, turn(world, binding, tasks) as sessions:
        for kind in MALFORMED:
            args = {"kind": kind, "key": world.key(kind)}
            outcomes[kind] = tool_outcome(await call_tool(sessions["work-control"], "malformed", args))
        assert tasks.following == frozenset()
    for kind, outcome in outcomes.items():
        assert outcome.failed, kind
        assert outcome.text.startswith("Not accepted: the tool server answered with a malformed task handle")
        assert "\x07" not in outcome.text and "sleeping" not in outcome.text  # the field, not the value
    assert "taskId" in outcomes["no_id"].text and "status" in outcomes["status"].text
    assert "pollIntervalMs" in outcomes["poll"].text
    assert binding.adopted == [] and reporter.reports == []
    assert len(world.records("work-control")) == len(MALFORMED)  # each call reached the server


@pytest.mark.anyio
async def test_a_refused_adoption_cancels_the_task_and_tells_the_model(world: World) -> None:
    binding, reporter = Binding(refuse=E.Closed("the run is closed")), Reporter()
    async with TaskHost(reporter) as tasks, turn(world, binding, tasks) as sessions:
        outcome = tool_outcome(
            await call_tool(sessions["work-control"], "job", {"key": world.key("a"), "text": "x"})
        )
    assert outcome.failed and "(closed)" in outcome.text and "asked to cancel it" in outcome.text
    assert [r["method"] for r in world.records("work-control")] == ["tools/call", "tasks/cancel"]


@pytest.mark.anyio
async def test_an_adoption_that_met_an_unreachable_service_is_asked_again(world: World) -> None:
    binding, reporter = Binding(follow="service", blinks=2), Reporter()
    async with TaskHost(reporter) as tasks, turn(world, binding, tasks) as sessions:
        outcome = tool_outcome(
            await call_tool(sessions["work-control"], "job", {"key": world.key("a"), "text": "x"})
        )
    assert not outcome.failed and outcome.text.startswith("Accepted:")
    assert len(binding.adopted) == 1
    assert [r["method"] for r in world.records("work-control")] == ["tools/call"]  # nothing cancelled


@pytest.mark.anyio
async def test_a_host_followed_task_is_polled_after_the_turn_and_reported_until_terminal(
    world: World,
) -> None:
    binding, reporter = Binding(), Reporter()
    async with TaskHost(reporter) as tasks:
        async with turn(world, binding, tasks) as sessions:
            outcome = tool_outcome(
                await call_tool(sessions["work-control"], "job", {"key": world.key("a"), "text": "reindex"})
            )
            assert tasks.following == {"c_1"}
        # The turn is over; the session is still owned by the TaskHost, and polled.
        await until(lambda: len(reporter.reports) >= 1)
        assert tasks.following == {"c_1"} and {o.status for _, o in reporter.reports} == {"working"}
        world.open_gate("a")
        await until(lambda: not tasks.following)
    assert not outcome.failed
    *working, (cid, final) = reporter.reports
    assert cid == "c_1" and all(o.status == "working" for _, o in working)
    assert final.status == "completed" and final.result is not None
    assert final.result["structuredContent"] == {"job": "reindex", "finished": True}
    assert final.result["content"] == [{"type": "text", "text": "reindex finished"}]


@pytest.mark.anyio
async def test_a_failed_task_is_reported_with_its_message(world: World) -> None:
    binding, reporter = Binding(), Reporter()
    world.open_gate("a", "fail")
    async with TaskHost(reporter) as tasks:
        async with turn(world, binding, tasks) as sessions:
            await call_tool(sessions["work-control"], "job", {"key": world.key("a"), "text": "x"})
        await until(lambda: not tasks.following)
    ((_, final),) = reporter.reports
    assert final.status == "failed" and final.message == f"{world.key('a')} broke"


@pytest.mark.anyio
async def test_a_cancel_answer_sends_tasks_cancel_and_stops_following(world: World) -> None:
    binding, reporter = Binding(), Reporter(cancel=True)
    async with TaskHost(reporter) as tasks:
        async with turn(world, binding, tasks) as sessions:
            await call_tool(sessions["work-control"], "job", {"key": world.key("a"), "text": "x"})
        await until(lambda: not tasks.following)
        assert tasks.cancels_sent == 1
    assert len(reporter.reports) == 1
    assert [r["method"] for r in world.records("work-control")] == ["tools/call", "tasks/get", "tasks/cancel"]


@pytest.mark.anyio
async def test_leaving_the_task_host_stops_following(world: World) -> None:
    binding, reporter = Binding(), Reporter()
    async with TaskHost(reporter) as tasks:
        async with turn(world, binding, tasks) as sessions:
            await call_tool(sessions["work-control"], "job", {"key": world.key("a"), "text": "x"})
        await until(lambda: len(reporter.reports) >= 1)
    assert repr(tasks).startswith("<TaskHost sessions=0 following=0")
    reported = len(reporter.reports)
    world.open_gate("a")
    await anyio.sleep(0.6)  # more than two poll intervals: nobody polls any more
    assert len(reporter.reports) == reported
    assert all(o.status == "working" for _, o in reporter.reports)


@pytest.mark.anyio
async def test_a_server_that_cannot_start_fails_its_turn_not_the_task_host(
    world: World, tmp_path: Path
) -> None:
    binding, reporter = Binding(), Reporter()
    (tmp_path / "broken").mkdir()
    broken = {"work-control": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]}}
    bad_config = load(write_config(tmp_path / "broken", servers=broken))
    with pytest.raises(Exception) as plain:
        async with connect_servers(binding, bad_config):  # type: ignore[arg-type]
            pass
    with pytest.raises(Exception) as hosted:
        async with TaskHost(reporter) as tasks, connect_servers(binding, bad_config, tasks=tasks):  # type: ignore[arg-type]
            pass
    assert leaves(hosted.value) == leaves(plain.value)  # the same error, no extra wrapping
    async with TaskHost(reporter) as tasks:
        with pytest.raises(Exception):  # noqa: B017
            async with connect_servers(binding, bad_config, tasks=tasks):  # type: ignore[arg-type]
                pass
        # The TaskHost is still serving: the next turn works.
        async with turn(world, binding, tasks) as sessions:
            outcome = tool_outcome(
                await call_tool(sessions["work-control"], "job", {"key": world.key("a"), "text": "x"})
            )
        assert not outcome.failed


def leaves(exc: BaseException) -> list[str]:
    if isinstance(exc, BaseExceptionGroup):
        return [f"{type(exc).__name__}/{leaf}" for sub in exc.exceptions for leaf in leaves(sub)]
    return [repr(exc)]


@pytest.mark.anyio
async def test_one_task_failing_to_report_does_not_stop_the_others(world: World) -> None:
    binding, reporter = Binding(), Reporter(broken="c_1")
    async with TaskHost(reporter) as tasks:
        async with turn(world, binding, tasks) as sessions:
            for key in ("a", "b"):
                await call_tool(sessions["work-control"], "job", {"key": world.key(key), "text": key})
        world.open_gate("a")
        world.open_gate("b")
        await until(lambda: not tasks.following)
    assert {(cid, o.status) for cid, o in reporter.reports if o.status != "working"} == {("c_2", "completed")}


@pytest.mark.anyio
async def test_a_server_asking_for_rare_polls_still_gets_polled_within_the_renewal_bound(
    world: World,
) -> None:
    """pollIntervalMs of 10^9: clamped to 60 s by the cadence, and to ``renew_every_s`` so that
    the host's reports keep renewing its lease."""
    binding, reporter = Binding(), Reporter()
    async with TaskHost(reporter, renew_every_s=0.3) as tasks:
        async with turn(world, binding, tasks) as sessions:
            args = {"key": world.key("slow"), "text": "x", "poll_ms": 10**9}
            await call_tool(sessions["work-control"], "job", args)
        ((_, handle),) = binding.adopted
        assert handle.poll_interval_ms == 10**9
        await until(lambda: len(reporter.reports) >= 3)
    assert all(o.status == "working" and o.poll_interval_ms == 10**9 for _, o in reporter.reports)
    with pytest.raises(ValueError):
        TaskHost(reporter, renew_every_s=0)

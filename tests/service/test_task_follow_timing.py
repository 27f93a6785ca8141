"""The task follower's schedule, stepped on a fake clock against a scripted wire.

No server and no SDK: the wire answers what each test scripts, the clock moves only when the
test moves it, and ``poll_due`` runs exactly the polls that are due. Covered: a first poll at
once (also after a restart), the poll interval clamp (0 and 10^9), the unhinted ramp, the
error backoff, never a poll at or past the deadline, five consecutive broken answers end as a
protocol error, an unknown task is lost, a huge answer is too large, cancel is sent once and
recorded (also when it fails), and the change signal wakes the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace

import anyio
import msgspec
import pytest

from afterword.app.ports import FollowedTask
from afterword.config import McpServer
from afterword.continuations.errors import InvalidTransition
from afterword.disk import DiskError
from afterword.protocol.taskanswers import Answer, AnswerOverCap, Malformed, Polled, Unknown, Unreachable
from afterword.protocol.tasks import TaskOutcome, TaskReport
from afterword.worker.taskfollow import TaskFollower, follows_any

URL = "http://127.0.0.1:9/mcp"
HOUR = 3_600_000


def Followed(cid: str, task_id: str, deadline_ms: int, **changes: object) -> FollowedTask:
    fields: dict[str, object] = {"server": "tasks", "url": URL, "cancel_requested": False, **changes}
    return FollowedTask(continuation_id=cid, task_id=task_id, deadline_ms=deadline_ms, **fields)  # type: ignore[arg-type]


@dataclass
class FakePort:
    """The service side of the port, reduced to what the follower may observe."""

    tasks: dict[str, FollowedTask] = field(default_factory=dict)
    outcomes: list[tuple[str, TaskOutcome]] = field(default_factory=list)
    cancels: list[tuple[str, bool, str | None]] = field(default_factory=list)

    def tasks_to_follow(self) -> list[FollowedTask]:
        return list(self.tasks.values())

    async def report_task_outcome(self, cid: str, outcome: TaskOutcome) -> TaskReport:
        self.outcomes.append((cid, outcome))
        if outcome.status == "input_required":
            return TaskReport(state="pending", cancel=True)
        if outcome.status != "working":
            self.tasks.pop(cid, None)
            return TaskReport(state="ended", cancel=False)
        return TaskReport(state="pending", cancel=False)

    async def record_task_cancel_sent(self, cid: str, ok: bool, detail: str | None) -> None:
        self.cancels.append((cid, ok, detail))
        self.tasks.pop(cid, None)


@dataclass
class ScriptedWire:
    answers: dict[str, list[Answer]] = field(default_factory=dict)
    cancel_refusal: str | None = None
    gets: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    timeouts: list[float] = field(default_factory=list)

    async def get(self, url: str, headers: Mapping[str, str], task_id: str, timeout_s: float) -> Answer:
        self.gets.append(task_id)
        self.timeouts.append(timeout_s)
        script = self.answers[task_id]
        return script.pop(0) if len(script) > 1 else script[0]

    async def cancel(
        self, url: str, headers: Mapping[str, str], task_id: str, timeout_s: float
    ) -> str | None:
        self.cancelled.append(task_id)
        return self.cancel_refusal


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def working(interval: int | None) -> Polled:
    return Polled(TaskOutcome(status="working", poll_interval_ms=interval))


def follower(port: FakePort, wire: ScriptedWire, clock: Clock) -> TaskFollower:
    return TaskFollower(port, wire, limiter=anyio.CapacityLimiter(4), clock_ms=clock, jitter=lambda: 0.0)


def one_task(clock: Clock, *answers: Answer, deadline_ms: int = HOUR) -> tuple[FakePort, ScriptedWire]:
    port = FakePort(tasks={"c1": Followed("c1", "t1", clock.now + deadline_ms)})
    return port, ScriptedWire(answers={"t1": list(answers)})


@pytest.mark.anyio
@pytest.mark.parametrize(("hint", "delay"), [(0, 250), (10**9, 60_000), (None, 1000), (1500, 1500)])
async def test_working_polls_again_after_the_clamped_interval(hint: int | None, delay: int) -> None:
    clock = Clock()
    port, wire = one_task(clock, working(hint))
    f = follower(port, wire, clock)
    f.refresh()
    assert await f.poll_due() == ["c1"]  # the first poll is at once
    assert f.next_due_ms() == clock.now + delay
    clock.now += delay - 1
    assert await f.poll_due() == []
    clock.now += 1
    assert await f.poll_due() == ["c1"]
    assert wire.gets == ["t1", "t1"]
    assert [o.status for _, o in port.outcomes] == ["working", "working"]


@pytest.mark.anyio
async def test_unreachable_backs_off_and_never_polls_at_the_deadline() -> None:
    clock = Clock()
    port, wire = one_task(clock, Unreachable("ConnectError"), deadline_ms=10_000)
    f = follower(port, wire, clock)
    f.refresh()
    times = []
    while (due := f.next_due_ms()) is not None:
        clock.now = due
        if await f.poll_due():
            times.append(clock.now - 1_000_000)
    # 2 s, 4 s backoff (1 s without a hint, doubled per failure); the next (8 s later) would
    # pass the 10 s deadline: no poll at or after it.
    assert times == [0, 2000, 6000]
    assert port.outcomes == []  # the service's expiry decides, not the follower
    assert wire.timeouts[-1] == pytest.approx(4.0)  # a request never outlives the deadline


@pytest.mark.anyio
async def test_five_consecutive_broken_answers_end_as_a_protocol_error() -> None:
    clock = Clock()
    port, wire = one_task(clock, Malformed("wrong id"))
    f = follower(port, wire, clock)
    f.refresh()
    for _ in range(5):
        clock.now = f.next_due_ms() or clock.now
        assert await f.poll_due() == ["c1"]
    assert [o.status for _, o in port.outcomes] == ["protocol_error"]
    assert f.next_due_ms() is None


@pytest.mark.anyio
async def test_a_good_answer_resets_the_broken_answer_count() -> None:
    clock = Clock()
    bad = Malformed("wrong id")
    port, wire = one_task(clock, bad, bad, bad, bad, working(300), bad, bad, bad, bad, working(300))
    f = follower(port, wire, clock)
    f.refresh()
    for _ in range(10):
        clock.now = f.next_due_ms() or clock.now
        await f.poll_due()
    assert {o.status for _, o in port.outcomes} == {"working"}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("answer", "status"),
    [(Unknown("Task t1 not found"), "lost"), (AnswerOverCap(1024), "too_large")],
)
async def test_lost_and_too_large_are_reported_at_once(answer: Answer, status: str) -> None:
    clock = Clock()
    port, wire = one_task(clock, answer)
    f = follower(port, wire, clock)
    f.refresh()
    await f.poll_due()
    assert [(cid, o.status) for cid, o in port.outcomes] == [("c1", status)]
    f.refresh()
    assert f.next_due_ms() is None


@pytest.mark.anyio
@pytest.mark.parametrize("refusal", [None, "error -32603: backend down"])
async def test_input_required_sends_cancel_once_and_records_it(refusal: str | None) -> None:
    clock = Clock()
    port, wire = one_task(clock, Polled(TaskOutcome(status="input_required", message="which db?")))
    wire.cancel_refusal = refusal
    f = follower(port, wire, clock)
    f.refresh()
    await f.poll_due()
    assert wire.cancelled == ["t1"]
    assert port.cancels == [("c1", refusal is None, refusal)]
    clock.now += HOUR // 2
    f.refresh()
    assert await f.poll_due() == []  # a failing cancel is recorded, never retried
    assert wire.cancelled == ["t1"]


@pytest.mark.anyio
async def test_operator_cancel_is_due_at_once_and_sent_once() -> None:
    clock = Clock()
    port, wire = one_task(clock, working(60_000))
    f = follower(port, wire, clock)
    f.refresh()
    await f.poll_due()
    clock.now += 10
    port.tasks["c1"] = msgspec.structs.replace(port.tasks["c1"], cancel_requested=True)
    port.cancels.clear()
    f.refresh()
    assert f.next_due_ms() == clock.now
    assert await f.poll_due() == ["c1"]
    assert wire.cancelled == ["t1"] and port.cancels == [("c1", True, None)]
    assert wire.gets == ["t1"]  # no tasks/get once a cancel is requested


@pytest.mark.anyio
async def test_a_restart_polls_everything_at_once() -> None:
    clock = Clock()
    port = FakePort(tasks={f"c{i}": Followed(f"c{i}", f"t{i}", clock.now + HOUR) for i in range(3)})
    wire = ScriptedWire(answers={f"t{i}": [working(60_000)] for i in range(3)})
    first = follower(port, wire, clock)
    first.refresh()
    await first.poll_due()
    clock.now += 5
    again = follower(port, wire, clock)  # a new process: nothing of the schedule survived
    again.refresh()
    assert sorted(await again.poll_due()) == ["c0", "c1", "c2"]


@pytest.mark.anyio
async def test_the_loop_wakes_on_the_change_signal() -> None:
    """No poll is due for a minute; an adoption's change signal makes the loop poll at once (a
    change to a record that is not a service-followed task does not)."""
    clock = Clock()
    port, wire = one_task(clock, working(60_000))
    listeners = []
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await anyio.sleep_forever()

    f = TaskFollower(
        port,
        wire,
        limiter=anyio.CapacityLimiter(4),
        clock_ms=clock,
        subscribe=listeners.append,
        sleep=sleep,
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(f.run)
            while len(sleeps) < 1 or f.in_flight:
                await anyio.wait_all_tasks_blocked()
            assert wire.gets == ["t1"] and sleeps[-1] == pytest.approx(60.0)
            port.tasks["c2"] = Followed("c2", "t2", clock.now + HOUR)
            wire.answers["t2"] = [working(60_000)]
            listeners[0](None, SimpleNamespace(task=None))  # another record's change: no re-read
            await anyio.wait_all_tasks_blocked()
            assert wire.gets == ["t1"]
            listeners[0](None, SimpleNamespace(task=SimpleNamespace(follow="service")))
            while wire.gets.count("t2") < 1 or f.in_flight:
                await anyio.wait_all_tasks_blocked()
            await f.stop()
    assert wire.gets == ["t1", "t2"]


def test_the_follower_is_wanted_only_for_a_selected_http_server() -> None:
    servers = {
        "web": McpServer(name="web", transport="http", url=URL),
        "local": McpServer(name="local", transport="stdio", command="/bin/true"),
    }
    assert follows_any(servers, ["local", "web"])
    assert not follows_any(servers, ["local"])  # a stdio server's tasks are the host's to follow
    assert not follows_any(servers, [])
    assert not follows_any(servers, ["gone"])


@pytest.mark.anyio
async def test_a_surprise_in_the_wire_backs_off_without_ending_anything() -> None:
    clock = Clock()
    port, wire = one_task(clock, working(300))

    async def broken(url: str, headers: Mapping[str, str], task_id: str, timeout_s: float) -> Answer:
        raise RuntimeError("a bug")

    wire.get = broken  # type: ignore[method-assign]
    f = follower(port, wire, clock)
    f.refresh()
    assert await f.poll_due() == ["c1"]
    assert port.outcomes == [] and f.next_due_ms() == clock.now + 2000


@pytest.mark.anyio
@pytest.mark.parametrize(("jitter", "delays"), [(0.0, [500, 1000, 2000]), (0.999, [400, 800, 1600])])
async def test_the_backoff_doubles_the_servers_hint_and_jitter_only_shortens_it(
    jitter: float, delays: list[int]
) -> None:
    clock = Clock()
    port = FakePort(tasks={"c1": Followed("c1", "t1", clock.now + HOUR, poll_interval_ms=0)})
    wire = ScriptedWire(answers={"t1": [Unreachable("ConnectError")]})
    f = TaskFollower(port, wire, limiter=anyio.CapacityLimiter(1), clock_ms=clock, jitter=lambda: jitter)
    f.refresh()
    seen = []
    for _ in delays:
        await f.poll_due()
        due = f.next_due_ms()
        assert due is not None
        seen.append(due - clock.now)
        clock.now = due
    assert seen == delays  # a hint of 0 is 250 ms, doubled per failure; never below 250 ms


@pytest.mark.anyio
async def test_a_cancel_owed_after_the_record_ended_elsewhere_is_still_sent() -> None:
    """The record ended under the follower (an operator was first): it stops polling, and the
    cancel the service then says is owed is still sent."""
    clock = Clock()
    port, wire = one_task(clock, working(300))

    async def ended_elsewhere(cid: str, outcome: TaskOutcome) -> TaskReport:
        raise InvalidTransition("cancelled", "task_outcome")

    port.report_task_outcome = ended_elsewhere  # type: ignore[method-assign]
    f = follower(port, wire, clock)
    f.refresh()
    await f.poll_due()
    assert f.next_due_ms() is None  # nothing more to poll
    port.tasks["c1"] = msgspec.structs.replace(port.tasks["c1"], cancel_requested=True)
    f.refresh()
    assert await f.poll_due() == ["c1"]
    assert wire.cancelled == ["t1"] and port.cancels == [("c1", True, None)]


@pytest.mark.anyio
async def test_a_cancel_the_service_could_not_record_is_recorded_later_not_sent_again() -> None:
    clock = Clock()
    port, wire = one_task(clock, working(300))
    port.tasks["c1"] = msgspec.structs.replace(port.tasks["c1"], cancel_requested=True)
    record = port.record_task_cancel_sent
    failures = [DiskError("EIO")]

    async def flaky(cid: str, ok: bool, detail: str | None) -> None:
        if failures:
            raise failures.pop()
        await record(cid, ok, detail)

    port.record_task_cancel_sent = flaky  # type: ignore[method-assign]
    f = follower(port, wire, clock)
    f.refresh()
    await f.poll_due()
    assert wire.cancelled == ["t1"] and port.cancels == []
    clock.now = f.next_due_ms() or clock.now
    assert await f.poll_due() == ["c1"]
    assert wire.cancelled == ["t1"] and port.cancels == [("c1", True, None)]


@pytest.mark.anyio
async def test_a_failing_read_of_the_port_does_not_stop_the_loop() -> None:
    clock = Clock()
    port, wire = one_task(clock, working(60_000))
    listeners = []
    reads = 0
    real = port.tasks_to_follow

    def flaky() -> list[FollowedTask]:
        nonlocal reads
        reads += 1
        if reads == 1:
            raise KeyError("a bug")
        return real()

    port.tasks_to_follow = flaky  # type: ignore[method-assign]
    f = TaskFollower(port, wire, limiter=anyio.CapacityLimiter(4), clock_ms=clock, subscribe=listeners.append)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(f.run)
            await anyio.wait_all_tasks_blocked()
            assert wire.gets == []
            listeners[0](None, SimpleNamespace(task=SimpleNamespace(follow="service")))
            while not wire.gets or f.in_flight:
                await anyio.wait_all_tasks_blocked()
            await f.stop()
    assert wire.gets == ["t1"] and reads >= 2

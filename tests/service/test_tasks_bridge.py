"""The service side of the MCP Tasks bridge, against both ways of being a host (the in-process
handle and the host API over loopback HTTP, as tests/service/test_host_parity.py): adoption bound like
a claim, each row of the outcome table, cancel, the host's lease, and restart."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError
from pathlib import Path
from typing import Any

import anyio
import pytest
from _service import ENV, write_config
from _ui import sign_in
from test_host_binding import CONV, ORIGIN, REPLY, SERVER, serving
from test_host_parity import Host, hosting
from test_http_protocol import Clock
from test_http_protocol import serving as protocol_serving

import afterword
from afterword.app.tasks import mcp_sdk_available
from afterword.cli import main as cli_main
from afterword.clients.operator import read_host_token
from afterword.config import ConfigError
from afterword.continuations import FALLBACK_TEXT
from afterword.continuations.errors import (
    AdmissionLimit,
    Closed,
    Conflict,
    InvalidRequest,
    RunClosed,
    Unavailable,
)
from afterword.continuations.jcs import canonical_json
from afterword.protocol import paths
from afterword.protocol.tasks import TaskHandle, TaskOutcome, TaskReport

pytestmark = pytest.mark.anyio
WEB = "web-tasks"
SERVERS = {
    SERVER: {"command": "python3", "args": ["-c", "pass"]},
    WEB: {"url": "http://127.0.0.1:9/mcp"},
}
HANDLE = TaskHandle(task_id="task-7", status="working", poll_interval_ms=500, ttl_ms=None)


@pytest.fixture(params=["embedded", "http"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    def make(**kw: Any) -> Any:
        kw.setdefault("servers", SERVERS)
        kw.setdefault("selected", [SERVER, WEB])
        return hosting(request.param, tmp_path, **kw)

    return make


async def report(x: Host, cid: str, outcome: TaskOutcome) -> TaskReport:
    """A host's report: the host API's route over HTTP, the handle's method embedded."""
    if x.client is None:
        return await x.h.service.report_task_outcome(cid, outcome)
    return await x.client.report_task_outcome(cid, outcome)


async def adopted(
    x: Host, handle: TaskHandle = HANDLE, server: str = SERVER, **begin: Any
) -> tuple[Any, str]:
    run = await x.begin(**begin)
    task = await run.adopt_task(server, handle)
    return run, task.continuation_id


def completed(
    structured: Any = None, texts: tuple[str, ...] = ("done",), is_error: bool = False
) -> TaskOutcome:
    result: dict[str, Any] = {"content": [{"type": "text", "text": t} for t in texts], "isError": is_error}
    if structured is not None:
        result["structuredContent"] = structured
    return TaskOutcome(status="completed", result=result)


# -- adoption ------------------------------------------------------------------------------
async def test_adoption_is_bound_like_a_claim_and_idempotent(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin(mode="notify_if_actionable")
        first = await run.adopt_task(SERVER, HANDLE)
        assert first.follow == "host"  # a stdio server lives with the host's session
        again = await run.adopt_task(SERVER, HANDLE)
        assert again == first
        rec = x.h.service.repo.get(first.continuation_id)
        assert rec is not None and rec.task is not None
        c = rec.claim
        assert (c.run_id, c.conversation_id, c.reply_to, c.mode, c.server_name) == (
            "run-1",
            CONV,
            REPLY,
            "notify_if_actionable",
            SERVER,
        )
        assert rec.origin_context == "pending" and rec.state == "claimed"
        assert (rec.task.task_id, rec.task.follow, rec.task.status) == ("task-7", "host", "working")
        other = await run.adopt_task(SERVER, TaskHandle(task_id="task-8", status="working"))
        assert other.continuation_id != first.continuation_id
        assert sorted(await run.close()) == sorted([first.continuation_id, other.continuation_id])
        assert await run.adopt_task(SERVER, HANDLE) == first  # a repeat still answers after close
        with pytest.raises(RunClosed) as late:
            await run.adopt_task(SERVER, TaskHandle(task_id="late", status="working"))
        assert isinstance(late.value, Closed) and late.value.status == 409
        await run.finalize(ORIGIN)
        await run.activate()
        rec = x.h.service.repo.get(first.continuation_id)
        assert rec is not None and rec.origin_context == "pinned"
        with pytest.raises(Closed):  # settled: 410 over HTTP, closed embedded
            await run.adopt_task(SERVER, TaskHandle(task_id="later", status="working"))


async def test_close_waits_for_an_adoption_inside_admission(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        entered, release, closed = anyio.Event(), anyio.Event(), anyio.Event()
        out: dict[str, Any] = {}

        async def paused() -> None:
            entered.set()
            await release.wait()

        async def adopt() -> None:
            out["task"] = await run.adopt_task(SERVER, HANDLE)

        async def close() -> None:
            out["active"] = await run.close()
            closed.set()

        x.h.service.hooks.before_claim_commit = paused
        async with anyio.create_task_group() as tg:
            tg.start_soon(adopt)
            await entered.wait()
            x.h.service.hooks.before_claim_commit = None
            tg.start_soon(close)
            with anyio.move_on_after(0.3):  # give close() every chance to (wrongly) finish
                await closed.wait()
            assert not closed.is_set()
            with pytest.raises(RunClosed):  # admission is closed while draining
                await run.adopt_task(SERVER, TaskHandle(task_id="late", status="working"))
            release.set()
        assert out["active"] == [out["task"].continuation_id]


async def test_the_same_task_id_in_another_run_is_another_continuation(host: Callable[..., Any]) -> None:
    async with host() as x:
        _, a = await adopted(x)
        _, b = await adopted(x, run_id="run-2")
        assert a != b


async def test_concurrent_adoptions_of_one_handle_make_one_continuation(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        got: list[Any] = []

        async def adopt() -> None:
            got.append(await run.adopt_task(SERVER, HANDLE))

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(adopt)
        assert len({t.continuation_id for t in got}) == 1 and len(got) == 8
        assert len(list(x.h.service.repo.live())) == 1
        assert await run.close() == [got[0].continuation_id]


async def test_racing_outcomes_end_the_record_once(host: Callable[..., Any]) -> None:
    async with host() as x:
        _, cid = await adopted(x)
        answers: list[TaskReport] = []

        async def send(outcome: TaskOutcome) -> None:
            answers.append(await report(x, cid, outcome))

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, completed({"a": 1}))
            tg.start_soon(send, TaskOutcome(status="cancelled"))
            tg.start_soon(send, TaskOutcome(status="lost"))
        rec = x.h.service.repo.get(cid)
        assert rec is not None and rec.state in ("result_received", "cancelled", "dead_lettered")
        ended = [h for h in rec.history if h.state != "claimed"]
        assert len(ended) == 1  # one transition out of claimed, whichever won
        assert rec.result is None or rec.state == "result_received"


async def test_adoption_refusals(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        with pytest.raises(InvalidRequest, match="not selected"):
            await run.adopt_task("not-selected", HANDLE)
        bad = [
            TaskHandle(task_id="", status="working"),
            TaskHandle(task_id="x" * 257, status="working"),
            TaskHandle(task_id="bad\nid", status="working"),
            TaskHandle(task_id="bad\x9bid", status="working"),
            TaskHandle(task_id="t", status="finished"),  # type: ignore[arg-type]
            TaskHandle(task_id="t", status="working", poll_interval_ms=-1),
        ]
        for handle in bad:
            with pytest.raises(InvalidRequest):
                await run.adopt_task(SERVER, handle)
        assert list(x.h.service.repo.live()) == []
        # Hostile hints are taken as given and clamped where used.
        ok = await run.adopt_task(
            SERVER, TaskHandle(task_id="t", status="working", poll_interval_ms=0, ttl_ms=10**9)
        )
        assert ok.follow == "host"


async def test_adoption_counts_against_the_admission_limits(host: Callable[..., Any]) -> None:
    async with host(limits={"maxActivePerOrigin": 1}) as x:
        run = await x.begin()
        await run.adopt_task(SERVER, HANDLE)
        with pytest.raises(AdmissionLimit):
            await run.adopt_task(SERVER, TaskHandle(task_id="second", status="working"))
        assert len(list(x.h.service.repo.live())) == 1


async def test_loopback_http_server_is_followed_by_the_service(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        task = await run.adopt_task(WEB, HANDLE)
        assert task.follow == "service"
        (followed,) = x.h.service.tasks_to_follow()
        assert (followed.continuation_id, followed.url, followed.task_id, followed.server) == (
            task.continuation_id,
            "http://127.0.0.1:9/mcp",
            "task-7",
            WEB,
        )
        assert not followed.cancel_requested and followed.poll_interval_ms == 500
        x.h.service._tasks.sdk_available = lambda: False
        with pytest.raises(Unavailable, match=r"afterword\[mcp\]") as caught:
            await run.adopt_task(WEB, TaskHandle(task_id="other", status="working"))
        assert caught.value.status == 503 and caught.value.code == "unavailable"


async def test_deadline_is_the_sooner_of_ttl_and_the_limit(host: Callable[..., Any]) -> None:
    async with host(limits={"taskDeadlineMs": 3_600_000}) as x:
        run = await x.begin()
        short = await run.adopt_task(SERVER, TaskHandle(task_id="a", status="working", ttl_ms=60_000))
        long = await run.adopt_task(SERVER, TaskHandle(task_id="b", status="working", ttl_ms=10**9))
        for cid, span in ((short.continuation_id, 60_000), (long.continuation_id, 3_600_000)):
            rec = x.h.service.repo.get(cid)
            assert rec is not None and rec.claim.deadline_ms - rec.claim.created_at_ms == span


async def test_abandoned_run_answers_with_the_fixed_fallback(host: Callable[..., Any]) -> None:
    async with host(run_worker=True) as x:
        run, cid = await adopted(x)
        await run.abandon()
        out = await report(x, cid, completed({"answer": 42}))
        assert out.state in ("result_received", "ready_to_deliver", "delivered")
        rec = await wait_state(x, cid, "delivered")
        assert rec.completion_kind == "origin_context_unavailable" and rec.text == FALLBACK_TEXT
        assert x.h.synth.requests == []


async def wait_state(x: Host, cid: str, state: str) -> Any:
    with anyio.fail_after(15):
        while True:
            rec = x.h.service.repo.get(cid)
            if rec is not None and rec.state == state:
                return rec
            await x.h.service.work_available.wait(0.05)


# -- outcomes ------------------------------------------------------------------------------
async def test_completed_structured_content_is_the_result_then_delivered(host: Callable[..., Any]) -> None:
    async with host(run_worker=True) as x:
        run, cid = await adopted(x)
        await run.close()
        await run.finalize(ORIGIN)
        await run.activate()
        assert (await report(x, cid, TaskOutcome(status="working", poll_interval_ms=10))).state == "claimed"
        out = await report(x, cid, completed({"files": 42, "summary": "Indexed 42 files"}))
        assert out.cancel is False
        rec = await wait_state(x, cid, "delivered")
        assert rec.result is not None and rec.result.idempotency_key == "task:task-7"
        expected = canonical_json({"files": 42, "summary": "Indexed 42 files"})
        assert rec.result.payload == expected
        assert rec.result.payload_hash == hashlib.sha256(expected).hexdigest()
        assert rec.task is not None and rec.task.status == "completed"
        (request,) = x.h.synth.requests
        assert request.conversation_id == CONV
        # A late outcome after the end changes nothing.
        version = x.h.service.repo.version(cid)
        late = await report(x, cid, TaskOutcome(status="failed", message="too late"))
        assert late.state == "delivered" and x.h.service.repo.version(cid) == version


async def test_a_failed_task_is_delivered_as_a_failure(host: Callable[..., Any]) -> None:
    async with host(run_worker=True) as x:
        run, cid = await adopted(x)
        await run.finalize(ORIGIN)
        await run.activate()
        await report(x, cid, TaskOutcome(status="failed", message="disk full"))
        rec = await wait_state(x, cid, "delivered")
        assert rec.text == "Update on your earlier request: the background task failed: disk full"
        assert [h.error for h in rec.history if h.state == "result_received"] == ["task_failed"]


async def test_completed_text_content_is_joined(host: Callable[..., Any]) -> None:
    async with host() as x:
        _, cid = await adopted(x)
        await report(x, cid, completed(texts=("line one", "line two")))
        rec = x.h.service.repo.get(cid)
        assert rec is not None and rec.result is not None
        assert json.loads(rec.result.payload) == {"text": "line one\nline two"}
        assert rec.state == "result_received" and rec.deferred  # waits for its origin, as a claim


@pytest.mark.parametrize(
    "outcome",
    [
        TaskOutcome(status="failed", message="disk full"),
        TaskOutcome(
            status="completed", result={"content": [{"type": "text", "text": "disk full"}], "isError": True}
        ),
    ],
    ids=["failed", "is_error"],
)
async def test_failure_becomes_a_result_that_says_so(host: Callable[..., Any], outcome: TaskOutcome) -> None:
    async with host() as x:
        _, cid = await adopted(x)
        await report(x, cid, outcome)
        rec = x.h.service.repo.get(cid)
        assert rec is not None and rec.result is not None and rec.state == "result_received"
        assert json.loads(rec.result.payload) == {"taskFailed": True, "message": "disk full"}
        assert rec.last_error is not None and rec.last_error.code == "task_failed"
        assert rec.history[-1].error == "task_failed"  # in the trail
        detail = x.h.service.continuation_detail(cid)
        assert detail.task is not None and detail.task.status == outcome.status


@pytest.mark.parametrize(
    ("outcome", "state", "code", "cancel"),
    [
        (TaskOutcome(status="cancelled"), "cancelled", "task_cancelled", False),
        (TaskOutcome(status="input_required"), "dead_lettered", "task_input_required", True),
        (TaskOutcome(status="lost", message="unknown task"), "dead_lettered", "task_lost", False),
        (TaskOutcome(status="protocol_error"), "dead_lettered", "task_protocol_error", False),
        (completed({"blob": "x" * (300 * 1024)}), "dead_lettered", "task_result_too_large", False),
    ],
    ids=["cancelled", "input_required", "lost", "protocol_error", "too_large"],
)
async def test_ending_rows(
    host: Callable[..., Any], outcome: TaskOutcome, state: str, code: str, cancel: bool
) -> None:
    async with host() as x:
        _, cid = await adopted(x)
        out = await report(x, cid, outcome)
        assert (out.state, out.cancel) == (state, cancel)
        rec = x.h.service.repo.get(cid)
        assert rec is not None and rec.state == state and rec.last_error is not None
        assert rec.last_error.code == code and rec.result is None
        assert rec.task is not None and rec.task.cancel_requested is cancel
        if cancel:  # handed to the host once: the next report does not ask again
            assert (await report(x, cid, TaskOutcome(status="cancelled"))).cancel is False


async def test_lost_task_is_shown_in_health(host: Callable[..., Any]) -> None:
    async with host() as x:
        _, cid = await adopted(x)
        await report(x, cid, TaskOutcome(status="lost", message="unknown task"))
        health = await x.call("continuation_health")
        (cause,) = [c for c in health.causes if c.code == "task_lost"]
        assert cause.ids == [cid] and "acknowledge" in cause.commands[0]


async def test_http_task_outcome_is_only_for_host_followed_tasks(tmp_path: Path) -> None:
    async with hosting("http", tmp_path, servers=SERVERS, selected=[SERVER, WEB]) as x:
        assert x.client is not None
        run = await x.begin()
        task = await run.adopt_task(WEB, HANDLE)
        with pytest.raises(Conflict, match="followed by the service"):
            await x.client.report_task_outcome(task.continuation_id, completed({"a": 1}))
        # The follower in the service applies it in process.
        out = await x.h.service.report_task_outcome(task.continuation_id, completed({"a": 1}))
        assert out.state == "result_received"


# -- cancel --------------------------------------------------------------------------------
async def test_cancel_of_a_host_followed_task_answers_the_next_report(host: Callable[..., Any]) -> None:
    async with host() as x:
        _, cid = await adopted(x)
        status = await x.call("cancel_continuation", cid)
        assert status.state == "cancelled"
        rec = x.h.service.repo.get(cid)
        assert rec is not None and rec.task is not None and rec.task.cancel_requested
        first = await report(x, cid, TaskOutcome(status="working"))
        assert (first.state, first.cancel) == ("cancelled", True)
        detail = x.h.service.continuation_detail(cid)
        assert detail.task is not None and detail.task.cancel == "sent"
        # The host may never have read that answer (a lost response, a service that died after
        # recording it): a task it still sees running is asked again, not left to run.
        again = await report(x, cid, TaskOutcome(status="working"))
        assert (again.state, again.cancel) == ("cancelled", True)
        # A task that ended on its server needs no cancel.
        assert (await report(x, cid, TaskOutcome(status="cancelled"))).cancel is False
        assert (await report(x, cid, completed({"a": 1}))).cancel is False


async def test_a_slow_host_back_after_its_lease_lapsed_is_told_to_cancel(host: Callable[..., Any]) -> None:
    async with host() as x:
        _, cid = await adopted(x)
        x.h.service._tasks.host_leases[cid] = 0  # lapsed long ago
        assert await x.h.service.expire_task_host_leases() == [cid]
        back = await report(x, cid, TaskOutcome(status="working"))
        assert (back.state, back.cancel) == ("dead_lettered", True)
        rec = x.h.service.repo.get(cid)
        assert rec is not None and rec.last_error is not None and rec.last_error.code == "task_host_gone"


async def test_cancel_of_a_service_followed_task_reaches_the_follower(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        cid = (await run.adopt_task(WEB, HANDLE)).continuation_id
        await x.call("cancel_continuation", cid)
        (followed,) = x.h.service.tasks_to_follow()
        assert followed.continuation_id == cid and followed.cancel_requested
        await x.h.service.record_task_cancel_sent(cid, False, "connection refused")
        assert x.h.service.tasks_to_follow() == []
        rec = x.h.service.repo.get(cid)
        assert rec is not None and rec.state == "cancelled" and rec.task is not None
        assert (rec.task.cancel_ok, rec.task.cancel_detail) == (False, "connection refused")
        detail = x.h.service.continuation_detail(cid)
        assert detail.task is not None and detail.task.cancel == "failed"


async def test_a_compacted_task_keeps_its_task_and_ignores_reports(host: Callable[..., Any]) -> None:
    async with host() as x:
        _, cid = await adopted(x)
        await report(x, cid, TaskOutcome(status="lost", message="gone"))
        await x.h.service.acknowledge_continuation(cid)  # the operator (no host verb)
        await x.h.service.apply_retention()
        assert x.h.service.repo.get(cid) is None and x.h.service.repo.tombstone(cid) is not None
        detail = x.h.service.continuation_detail(cid)
        assert detail.task is not None and (detail.task.task_id, detail.task.status) == ("task-7", "lost")
        late = await report(x, cid, completed({"a": 1}))
        assert (late.state, late.cancel) == ("dead_lettered", False)


async def test_retention_keeps_a_task_the_service_still_has_to_cancel(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        cid = (await run.adopt_task(WEB, HANDLE)).continuation_id
        await x.call("cancel_continuation", cid)
        await x.h.service.apply_retention()  # a settled record is compacted at the next pass...
        assert [t.continuation_id for t in x.h.service.tasks_to_follow()] == [cid]  # ...not this one
        await x.h.service.record_task_cancel_sent(cid, True, None)
        await x.h.service.apply_retention()
        assert x.h.service.repo.get(cid) is None and x.h.service.repo.tombstone(cid) is not None


async def test_a_compacted_cancel_is_still_handed_to_its_host(host: Callable[..., Any]) -> None:
    async with host() as x:
        _, cid = await adopted(x)
        await x.call("cancel_continuation", cid)
        await x.h.service.apply_retention()  # compacted before the host's next poll
        assert x.h.service.repo.get(cid) is None
        told = await report(x, cid, TaskOutcome(status="working"))
        assert (told.state, told.cancel) == ("cancelled", True)
        assert (await report(x, cid, TaskOutcome(status="cancelled"))).cancel is False


# -- the host's lease ------------------------------------------------------------------------
async def test_host_lease_lapse_dead_letters_and_reports_renew(host: Callable[..., Any]) -> None:
    async with host() as x:
        _, kept = await adopted(x)
        _, gone = await adopted(x, TaskHandle(task_id="other", status="working"))
        tasks = x.h.service._tasks
        tasks.host_leases[kept] = tasks.host_leases[gone] = 0  # both lapsed long ago
        await report(x, kept, TaskOutcome(status="working"))  # a report renews the lease
        assert await x.h.service.expire_task_host_leases() == [gone]
        rec = x.h.service.repo.get(gone)
        assert rec is not None and rec.state == "dead_lettered"
        assert rec.last_error is not None and rec.last_error.code == "task_host_gone"
        rec = x.h.service.repo.get(kept)
        assert rec is not None and rec.state == "claimed"
        await x.call("cancel_continuation", kept)  # ended otherwise: its lease is forgotten
        assert await x.h.service.expire_task_host_leases() == [] and tasks.host_leases == {}


async def test_service_followed_tasks_have_no_host_lease(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        cid = (await run.adopt_task(WEB, HANDLE)).continuation_id
        x.h.service._tasks.host_leases[cid] = 0
        assert await x.h.service.expire_task_host_leases() == []


# -- restart -------------------------------------------------------------------------------
async def test_crash_before_activation_behaves_like_a_claim(tmp_path: Path) -> None:
    async with serving(tmp_path, servers=SERVERS, selected=[SERVER, WEB]) as h:
        run = h.service.begin_run("run-1", CONV, REPLY)
        cid = (await run.adopt_task(WEB, HANDLE)).continuation_id
        host_cid = (await run.adopt_task(SERVER, HANDLE)).continuation_id
        config = h.config
    # The host died before activating: the next start abandons the origin, keeps the task.
    async with serving(tmp_path, config=config) as h:
        rec = h.service.repo.get(cid)
        assert rec is not None and rec.origin_context == "abandoned" and rec.state == "claimed"
        assert [t.continuation_id for t in h.service.tasks_to_follow()] == [cid]
        # A restarted service gives a host-followed task one full lease before judging it.
        assert host_cid not in h.service._tasks.host_leases
        assert await h.service.expire_task_host_leases() == []
        assert h.service._tasks.host_leases[host_cid] > h.service.clock_ms()
        rec = h.service.repo.get(host_cid)
        assert (
            rec is not None and rec.state == "claimed" and rec.task is not None and rec.task.follow == "host"
        )
        out = await h.service.report_task_outcome(cid, completed({"a": 1}))
        assert out.state == "result_received"


async def test_what_was_committed_before_a_restart_is_answered_once_after_it(tmp_path: Path) -> None:
    """The service stops right after a completed report's commit (nothing synthesized yet) and
    after a cancel that still owes the host its tasks/cancel. After the restart: the result is
    answered once, a host repeating the report it never saw answered changes nothing, and the
    owed cancel is still handed to the host."""
    async with serving(tmp_path, servers=SERVERS, selected=[SERVER, WEB]) as h:
        run = h.service.begin_run("run-1", CONV, REPLY)
        done = (await run.adopt_task(SERVER, HANDLE)).continuation_id
        owed = (await run.adopt_task(SERVER, TaskHandle(task_id="task-8", status="working"))).continuation_id
        await run.close()
        await run.finalize(ORIGIN)
        await run.activate()
        assert (
            await h.service.report_task_outcome(done, completed({"answer": 42}))
        ).state == "result_received"
        await h.service.cancel_continuation(owed)
        config = h.config
    async with serving(tmp_path, config=config, run_worker=True) as h:
        rec = h.service.repo.get(done)
        assert rec is not None and rec.result is not None  # durable before anything came of it
        again = await h.service.report_task_outcome(done, completed({"answer": 43}))
        assert again.cancel is False
        with anyio.fail_after(15):
            while (rec := h.service.repo.get(done)) is None or rec.state != "delivered":
                await h.service.work_available.wait(0.05)
        assert rec.result is not None and json.loads(rec.result.payload) == {"answer": 42}  # the first won
        assert len(h.synth.requests) == 1
        told = await h.service.report_task_outcome(owed, TaskOutcome(status="working"))
        assert (told.state, told.cancel) == ("cancelled", True)


# -- hostile input over the wire -------------------------------------------------------------
async def test_hostile_bodies_are_refused_and_never_echo_the_token(tmp_path: Path) -> None:
    async with serving(tmp_path, servers=SERVERS, selected=[SERVER, WEB]) as h:
        token = read_host_token(h.config)
        auth = {"Authorization": f"Bearer {token}"}
        base = h.service.base_url
        await h.client.post(
            base + paths.HOST_RUNS,
            headers=auth,
            json={"runId": "r", "conversationId": CONV, "replyTo": REPLY},
        )
        adopt_url = paths.url(paths.HOST_TASKS, base, run_id="r")
        bodies = [
            {"server": SERVER, "taskId": "t", "status": "working", "callbackUrl": "http://evil/"},
            {"server": SERVER, "taskId": "t\u0000", "status": "working"},
            {"server": SERVER, "taskId": "t" * 257, "status": "working"},
            {"server": SERVER, "taskId": "t", "status": "done"},
            {"server": SERVER, "taskId": "t", "status": "working", "url": "http://169.254.169.254/"},
        ]
        for body in bodies:
            resp = await h.client.post(adopt_url, headers=auth, json=body)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["code"] == "invalid_request" and token not in resp.text
        resp = await h.client.post(
            adopt_url, headers=auth, json={"server": SERVER, "taskId": "t", "status": "working"}
        )
        assert resp.status_code == 200
        cid = resp.json()["continuationId"]
        outcome_url = paths.url(paths.HOST_TASK_OUTCOME, base, cid=cid)
        for body in (
            {"status": "failed", "message": "m" * 1025},
            {"status": "failed", "message": "é" * 513},  # 1026 bytes
            {"status": "completed", "result": {"content": []}, "extra": 1},
            {"status": "exploded"},
            {"status": "completed"},
        ):
            resp = await h.client.post(outcome_url, headers=auth, json=body)
            assert resp.status_code == 400, resp.text
            assert token not in resp.text
        resp = await h.client.post(outcome_url, headers=auth, content=b"x" * (5 * 1024 * 1024))
        assert resp.status_code == 413
        rec = h.service.repo.get(cid)
        assert rec is not None and rec.state == "claimed"
        unknown = await h.client.post(
            paths.url(paths.HOST_TASK_OUTCOME, base, cid="c_nope"), headers=auth, json={"status": "working"}
        )
        assert unknown.status_code == 404
        nobody = await h.client.post(outcome_url, json={"status": "working"})
        assert nobody.status_code == 401
        assert (
            await h.client.post(
                paths.url(paths.HOST_TASKS, base, run_id="nope"),
                headers=auth,
                json={"server": SERVER, "taskId": "t", "status": "working"},
            )
        ).status_code == 404


async def test_hints_past_what_a_record_holds_are_refused_not_a_crash(tmp_path: Path) -> None:
    async with serving(tmp_path, servers=SERVERS, selected=[SERVER, WEB]) as h:
        auth = {"Authorization": f"Bearer {read_host_token(h.config)}", "Content-Type": "application/json"}
        base = h.service.base_url
        await h.client.post(
            base + paths.HOST_RUNS,
            headers=auth,
            json={"runId": "r", "conversationId": CONV, "replyTo": REPLY},
        )
        adopt_url = paths.url(paths.HOST_TASKS, base, run_id="r")
        for field in ("ttlMs", "pollIntervalMs"):
            for value in (b"100000000000000000000000", str(2**53 + 1).encode()):
                body = b'{"server":"%s","taskId":"t","status":"working","%s":%s}' % (
                    SERVER.encode(),
                    field.encode(),
                    value,
                )
                resp = await h.client.post(adopt_url, headers=auth, content=body)
                assert resp.status_code == 400, resp.text
                assert resp.json()["error"]["code"] == "invalid_request"
        ok = await h.client.post(
            adopt_url,
            headers=auth,
            json={"server": SERVER, "taskId": "t", "status": "working", "ttlMs": 2**53},
        )
        assert ok.status_code == 200, ok.text
        cid = ok.json()["continuationId"]
        outcome_url = paths.url(paths.HOST_TASK_OUTCOME, base, cid=cid)
        resp = await h.client.post(
            outcome_url, headers=auth, content=b'{"status":"working","pollIntervalMs":1e400}'
        )
        assert resp.status_code == 400
        resp = await h.client.post(
            outcome_url,
            headers=auth,
            content=b'{"status":"working","pollIntervalMs":100000000000000000000000}',
        )
        assert resp.status_code == 400, resp.text
        # Embedded, the same handle is refused by the same rule.
        run = h.service.begin_run("run-e", CONV, REPLY)
        for handle in (
            TaskHandle(task_id="big", status="working", ttl_ms=10**30),
            TaskHandle(task_id="big", status="working", poll_interval_ms=2**64),
        ):
            with pytest.raises(InvalidRequest, match="2\\^53"):
                await run.adopt_task(SERVER, handle)
        assert (await run.adopt_task(SERVER, HANDLE)).follow == "host"


async def test_text_without_a_utf8_form_is_refused_not_a_crash(tmp_path: Path) -> None:
    # JSON cannot carry a lone surrogate, but an embedded caller can build one: it must be a
    # clear refusal, not an encoding error out of the record's commit.
    async with serving(tmp_path, servers=SERVERS, selected=[SERVER, WEB]) as h:
        run = h.service.begin_run("run-1", CONV, REPLY)
        with pytest.raises(InvalidRequest, match="taskId"):
            await run.adopt_task(SERVER, TaskHandle(task_id="t\ud800", status="working"))
        cid = (await run.adopt_task(SERVER, HANDLE)).continuation_id
        for status in ("lost", "failed", "cancelled"):
            with pytest.raises(InvalidRequest, match="message"):
                await h.service.report_task_outcome(cid, TaskOutcome(status=status, message="gone \udc80"))  # type: ignore[arg-type]
        rec = h.service.repo.get(cid)
        assert rec is not None and rec.state == "claimed"
        assert (
            await h.service.report_task_outcome(cid, TaskOutcome(status="lost", message="gone"))
        ).state == "dead_lettered"


async def test_a_claim_is_not_a_task(tmp_path: Path) -> None:
    async with hosting("http", tmp_path, servers=SERVERS, selected=[SERVER, WEB]) as x:
        assert x.client is not None
        run = await x.begin()
        claim = await x.h.claimed(run.stdio_env(SERVER))
        with pytest.raises(Conflict, match="not backed by an MCP task"):
            await x.client.report_task_outcome(claim["continuationId"], TaskOutcome(status="working"))


# -- configuration -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("taskDeadlineMs", 0, "positive integer"),
        ("taskDeadlineMs", 30 * 24 * 3600 * 1000 + 1, "at most 2592000000"),
        ("taskHostLeaseMs", -5, "positive integer"),
        ("taskHostLeaseMs", 3_600_001, "at most 3600000"),
    ],
)
def test_task_limits_are_validated(tmp_path: Path, key: str, value: int, problem: str) -> None:
    path = write_config(tmp_path, continuations={"limits": {key: value}})
    with pytest.raises(ConfigError) as caught:
        afterword.load_config(path, environ=ENV)
    assert str(caught.value).startswith(f"continuations.limits.{key}: ") and problem in str(caught.value)


def test_task_limits_defaults_and_values(tmp_path: Path) -> None:
    limits = afterword.load_config(write_config(tmp_path), environ=ENV).limits
    assert (limits.task_deadline_ms, limits.task_host_lease_ms) == (24 * 3600 * 1000, 60_000)
    path = write_config(tmp_path, continuations={"limits": {"taskDeadlineMs": 5000, "taskHostLeaseMs": 700}})
    limits = afterword.load_config(path, environ=ENV).limits
    assert (limits.task_deadline_ms, limits.task_host_lease_ms) == (5000, 700)


# -- the operator's command line ------------------------------------------------------------------
async def test_cli_show_and_health_name_the_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with serving(tmp_path, servers=SERVERS, selected=[SERVER, WEB]) as h:
        run = h.service.begin_run("run-1", CONV, REPLY)
        cid = (await run.adopt_task(SERVER, HANDLE)).continuation_id
        await h.service.report_task_outcome(cid, TaskOutcome(status="lost", message="server restarted"))
        config = ["--config", str(h.config.config_path)]
        assert await anyio.to_thread.run_sync(cli_main, ["continuations", "show", *config, cid]) == 0
        out = capsys.readouterr().out
        assert "mcp task" in out and "task-7 on work-control, followed by the host" in out
        assert "last status" in out and "lost" in out and "task_lost: server restarted" in out
        code = await anyio.to_thread.run_sync(cli_main, ["continuations", "health", *config])
        out = capsys.readouterr().out
        assert code == 2 and "task_lost" in out and cid in out


# -- expiry ------------------------------------------------------------------------------------
async def test_an_expired_task_owes_its_server_a_cancel(tmp_path: Path) -> None:
    # No worker loop and so no live follower: the worker is stepped, so nothing can send (and
    # record) the owed cancel between the expiry and the assertions below.
    clock = Clock()
    path = write_config(tmp_path, servers=SERVERS, selected=[SERVER, WEB])
    config = afterword.load_config(path, environ=ENV)
    async with protocol_serving(tmp_path, config=config, clock=clock, run_worker=False) as h:
        run = h.service.begin_run("run-1", CONV, REPLY)
        handle = TaskHandle(task_id="slow", status="working", ttl_ms=60_000)
        cid = (await run.adopt_task(WEB, handle)).continuation_id
        await run.finalize(ORIGIN)
        await run.activate()
        clock.offset_ms += 61_000  # past the task's ttl: the worker expires it
        await h.service.worker.run_due()  # type: ignore[attr-defined]
        assert h.service.repo.get(cid).state == "expired"  # type: ignore[union-attr]
        (followed,) = h.service.tasks_to_follow()
        assert followed.continuation_id == cid and followed.cancel_requested
        late = await h.service.report_task_outcome(cid, completed({"a": 1}))
        assert (late.state, late.cancel) == ("expired", True)
        assert h.service.repo.get(cid).result is None  # type: ignore[union-attr]


async def test_status_page_shows_the_task(tmp_path: Path) -> None:
    async with serving(tmp_path, servers=SERVERS, selected=[SERVER, WEB]) as h:
        run = h.service.begin_run("run-1", CONV, REPLY)
        cid = (await run.adopt_task(WEB, HANDLE)).continuation_id
        await h.service.cancel_continuation(cid)
        await h.service.record_task_cancel_sent(cid, False, "connection refused")
        ui = await sign_in(h.client, h.service)
        page = await ui.get(f"/ui/c/{cid}")
        assert page.status_code == 200
        text = re.sub(r"<[^>]+>", " ", page.text)
        assert "MCP task" in text and "task-7" in text and f"on {WEB}" in text
        assert "the service" in text and "failed (connection refused)" in text


def test_only_the_sdk_2_line_can_follow_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mcp_sdk_available()  # the test venv runs the 2.x line
    for installed, usable in (("1.26.0", False), ("2.3.0", True), ("3.0.0", False)):
        monkeypatch.setattr("afterword.app.tasks.version", lambda _name, v=installed: v)
        assert mcp_sdk_available() is usable

    def missing(_name: str) -> str:
        raise PackageNotFoundError("mcp")

    monkeypatch.setattr("afterword.app.tasks.version", missing)
    assert mcp_sdk_available() is False


async def test_the_running_service_applies_host_lease_lapses_itself(tmp_path: Path) -> None:
    clock = Clock()
    path = write_config(tmp_path, continuations={"limits": {"taskHostLeaseMs": 1000}})
    config = afterword.load_config(path, environ=ENV)
    async with protocol_serving(tmp_path, config=config, clock=clock) as h:
        run = h.service.begin_run("run-1", CONV, REPLY)
        cid = (await run.adopt_task(SERVER, HANDLE)).continuation_id
        clock.offset_ms += 5_000  # the host went silent for five leases
        with anyio.fail_after(15):
            while (rec := h.service.repo.get(cid)) is None or rec.state != "dead_lettered":
                await h.service.work_available.wait(0.05)
        assert rec.last_error is not None and rec.last_error.code == "task_host_gone"

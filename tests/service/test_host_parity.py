"""One set of host behaviours, run against both ways of being a host: the in-process app
handle (``service.begin_run``) and the host API over loopback HTTP (``HostClient``). A
behaviour that holds for one and not the other fails here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from fakes.harness import after_full_scan
from test_host_binding import CONV, ORIGIN, REPLY, SERVER, Harness, serving

from afterword.app.binding import RESERVED_ENV, RESERVED_HEADERS, RunBinding
from afterword.blobs import BlobQuotaExceeded, BlobStore
from afterword.clients.hostapi_client import HostClient, RemoteRun
from afterword.clients.operator import read_host_token
from afterword.continuations import FALLBACK_TEXT, InvalidRequest
from afterword.continuations.errors import Conflict, RequestTooLarge

pytestmark = pytest.mark.anyio
Binding = RunBinding | RemoteRun


@dataclass
class Host:
    """The operations a host uses, the same for both kinds; ``h`` is the live service."""

    kind: str
    h: Harness
    client: HostClient | None

    async def begin(
        self, run_id: str = "run-1", conv: str = CONV, reply: str | None = REPLY, mode: str = "reply"
    ) -> Binding:
        if self.client is None:
            return self.h.service.begin_run(run_id, conv, reply, mode)
        return await self.client.begin_run(run_id, conv, reply, mode)

    async def call(self, name: str, *args: Any, **kw: Any) -> Any:
        """A continuation operation of the handle: ``continuation_health``, ``retry_...``."""
        target: Any = self.client if self.client is not None else self.h.service
        result = getattr(target, name)(*args, **kw)
        return await result if isinstance(result, Awaitable) else result


@asynccontextmanager
async def hosting(kind: str, root: Path, **kw: Any) -> AsyncIterator[Host]:
    async with serving(root, **kw) as h:
        if kind == "embedded":
            yield Host(kind, h, None)
        else:
            async with HostClient(h.service.base_url, read_host_token(h.config)) as client:
                yield Host(kind, h, client)


@pytest.fixture(params=["embedded", "http"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    return lambda **kw: hosting(request.param, tmp_path, **kw)


async def test_reserved_values_bind_the_claim_to_the_run(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin(mode="notify_if_actionable")
        assert list(run.servers) == [SERVER]
        evil = {"MONO_AGENT_CONTINUATION_CLAIM_URL": "http://evil.example/", "KEEP": "1"}
        env = run.stdio_env(SERVER, evil)
        assert env["KEEP"] == "1" and env["MONO_AGENT_CONTINUATION_CLAIM_URL"] == x.h.service.claim_url
        assert {k for k in env if k.startswith("MONO_")} == set(RESERVED_ENV)
        assert env["MONO_AGENT_CONTINUATION_CLAIM_MODE"] == "notify_if_actionable"
        headers = run.http_headers(SERVER, {"X-Mono-Agent-Continuation-Claim-Token": "evil"})
        assert set(headers) == set(RESERVED_HEADERS)
        assert headers["x-mono-agent-continuation-claim-token"] == env["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]
        assert run.stdio_env("not-selected", {"A": "1"}) == {"A": "1"}  # no authority
        claim = await x.h.claimed(env)
        assert claim["fingerprint"] == env["MONO_AGENT_CONTINUATION_CLAIM_FINGERPRINT"]
        rec = x.h.service.repo.get(claim["continuationId"])
        assert rec is not None and rec.origin_context == "pending"
        assert (rec.claim.run_id, rec.claim.conversation_id, rec.claim.reply_to) == ("run-1", CONV, REPLY)


async def test_begin_rules(host: Callable[..., Any]) -> None:
    async with host() as x:
        for args in (("", CONV, REPLY, "reply"), ("r", "", REPLY, "reply"), ("r", CONV, None, "reply")):
            with pytest.raises(InvalidRequest):
                await x.begin(*args)
        with pytest.raises(InvalidRequest):
            await x.begin("r", CONV, REPLY, "broadcast")
        capture = await x.begin("c", CONV, None, "capture")  # capture needs no physical route
        assert capture.stdio_env(SERVER)["MONO_AGENT_CONTINUATION_CLAIM_MODE"] == "capture"


async def test_close_waits_for_a_claim_inside_admission(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        env = run.stdio_env(SERVER)
        entered, release, closed = anyio.Event(), anyio.Event(), anyio.Event()
        out: dict[str, Any] = {}

        async def paused() -> None:
            entered.set()
            await release.wait()

        async def slow_claim() -> None:
            out["slow"] = await x.h.claim(env, "slow")

        async def close() -> None:
            out["active"] = await run.close()
            closed.set()

        x.h.service.hooks.before_claim_commit = paused
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_claim)
            await entered.wait()
            x.h.service.hooks.before_claim_commit = None
            tg.start_soon(close)
            with anyio.move_on_after(0.3):  # give close() every chance to (wrongly) finish
                await closed.wait()
            assert not closed.is_set()
            late = await x.h.claim(env, "late")  # admission is closed while draining
            assert late.status_code == 410
            release.set()
        cid = out["slow"].json()["continuationId"]
        assert out["active"] == [cid]
        assert [r.claim.task_key for r in x.h.service.repo.live()] == ["slow"]


async def test_close_without_claims_needs_no_snapshot(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        assert await run.close() == []
        assert run.stdio_env(SERVER) == {}  # closed: no authority left to hand out
        assert await run.finalize(ORIGIN) is None
        assert x.h.service.blobs.digests() == set()


async def test_finalize_then_activate_pins_every_active_claim(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        a = await x.h.claimed(run.stdio_env(SERVER), "a")
        b = await x.h.claimed(run.stdio_env(SERVER), "b")
        ids = sorted([a["continuationId"], b["continuationId"]])
        assert sorted(await run.close()) == ids
        digest = await run.finalize(ORIGIN)
        assert digest is not None and digest in x.h.service.blobs.digests()
        assert [(await x.h.status(c))["originContext"] for c in (a, b)] == ["pending", "pending"]
        await run.activate()
        assert [(await x.h.status(c))["originContext"] for c in (a, b)] == ["pinned", "pinned"]
        marker = x.h.service.repo.activation("run-1")
        assert marker is not None and sorted(marker.claim_ids) == ids


async def test_finalize_refuses_what_cannot_be_secured(host: Callable[..., Any]) -> None:
    async with host(run_worker=True) as x:
        run = await x.begin()
        claim = await x.h.claimed(run.stdio_env(SERVER))
        huge = [{"role": "user", "content": "x" * (64 * 1024 + 1)}, {"role": "assistant", "content": "ok"}]
        for history in (huge, [{"role": "user", "content": "no answer"}]):
            with pytest.raises(Exception) as caught:
                await run.finalize(history)
            assert getattr(caught.value, "status", None) == 400, caught.value
        x.h.service.blobs = BlobStore(x.h.service.store.root, x.h.service.store.secret, quota=1024)
        x.h.service.blobs.put(b"x" * 1000)
        with pytest.raises((BlobQuotaExceeded, RequestTooLarge)):
            await run.finalize(ORIGIN)
        rec = x.h.service.repo.get(claim["continuationId"])
        assert rec is not None and rec.snapshot_digest is None and rec.origin_context == "pending"
        await run.abandon()  # the host fails its turn
        await x.h.submit(claim)
        done = await x.h.wait_delivered(claim)
        assert done["completionKind"] == "origin_context_unavailable" and x.h.synth.requests == []


async def test_early_result_waits_for_activation(host: Callable[..., Any]) -> None:
    async with host(run_worker=True) as x:
        run = await x.begin()
        claim = await x.h.claimed(run.stdio_env(SERVER))
        accepted = await x.h.submit(claim)
        assert (accepted["state"], accepted["deferred"]) == ("result_received", True)
        await run.finalize(ORIGIN)
        await after_full_scan(x.h.service.worker)  # the running worker looked at it (to act wrongly)
        assert (await x.h.status(claim))["state"] == "result_received"
        await run.activate()
        done = await x.h.wait_delivered(claim)
        assert (done["state"], done["originContext"], done["completionKind"]) == (
            "delivered",
            "pinned",
            "synthesized",
        )
        (request,) = x.h.synth.requests
        assert request.conversation_id == CONV


async def test_abandon_delivers_the_fixed_fallback(host: Callable[..., Any]) -> None:
    async with host(run_worker=True) as x:
        run = await x.begin()
        claim = await x.h.claimed(run.stdio_env(SERVER))
        await x.h.submit(claim)
        await run.finalize(ORIGIN)
        await run.abandon()
        assert run.settled == "abandoned"
        done = await x.h.wait_delivered(claim)
        assert (done["originContext"], done["completionKind"]) == ("abandoned", "origin_context_unavailable")
        from _service import outbox_lines

        assert [line["text"] for line in outbox_lines(x.h.config)] == [FALLBACK_TEXT]


async def test_settlement_is_final(host: Callable[..., Any]) -> None:
    async with host() as x:
        run = await x.begin()
        claim = await x.h.claimed(run.stdio_env(SERVER))
        await run.finalize(ORIGIN)
        await run.activate()
        await run.abandon()  # too late: the origin already committed
        assert (await x.h.status(claim))["originContext"] == "pinned"


async def test_continuation_operations(host: Callable[..., Any]) -> None:
    async with host(run_worker=True) as x:
        run = await x.begin("cap", CONV, None, "capture")
        captured = await x.h.claimed(run.stdio_env(SERVER), "captured")
        other = await x.h.claimed(run.stdio_env(SERVER), "other")
        await run.finalize(ORIGIN)
        await run.activate()
        assert await x.call("captured_continuation_text", captured["continuationId"]) is None  # not yet
        await x.h.submit(captured)
        assert (await x.h.wait_delivered(captured))["state"] == "delivered"
        text = await x.call("captured_continuation_text", captured["continuationId"])
        assert text is not None and "Indexed 42 files" in text
        health = await x.call("continuation_health")
        assert health.status == "degraded" and health.active == 1  # "other" is still pending work
        page = await x.call("list_continuations", limit=1)
        assert len(page.items) == 1 and page.next_cursor is not None
        rest = await x.call("list_continuations", cursor=page.next_cursor)
        ids = {i.continuation_id for i in (*page.items, *rest.items)}
        assert ids == {captured["continuationId"], other["continuationId"]}
        with pytest.raises(Conflict):
            await x.call("retry_continuation", other["continuationId"])  # active: nothing to retry
        with pytest.raises(Conflict):
            await x.call("resolve_continuation_delivery", other["continuationId"], {"kind": "not_delivered"})
        cancelled = await x.call("cancel_continuation", other["continuationId"])
        assert cancelled.state == "cancelled"
        assert (await x.call("continuation_health")).status == "healthy"


async def test_a_settled_run_refuses_a_task_as_closed_not_as_a_conflict(host: Callable[..., Any]) -> None:
    # Closed-but-unsettled is RunClosed (HTTP 409); settled is final, plain Closed (HTTP 410),
    # and the embedded handle must raise the same kind the host API maps to 410.
    from afterword.continuations.errors import Closed, RunClosed
    from afterword.protocol.tasks import TaskHandle

    handle = TaskHandle(task_id="task-late", status="working")
    async with host() as x:
        closing = await x.begin("run-closing")
        await closing.close()
        with pytest.raises(RunClosed):
            await closing.adopt_task(SERVER, handle)
        run = await x.begin()
        await run.finalize(ORIGIN)
        await run.activate()
        with pytest.raises(Closed) as settled:
            await run.adopt_task(SERVER, handle)
        assert not isinstance(settled.value, RunClosed)

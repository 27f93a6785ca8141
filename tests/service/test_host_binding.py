"""The host side of request-bound claims: reserved names, close/drain, finalize, activate,
abandon and restart recovery, against the real service on a free loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from _service import ENV, deadline, outbox_lines, payload_hash, write_config
from fakes.harness import after_full_scan

import afterword
from afterword.app.binding import RESERVED_ENV, RESERVED_HEADERS, RunBinding
from afterword.app.service import ContinuationService
from afterword.blobs import BlobQuotaExceeded, BlobStore
from afterword.config import Config
from afterword.continuations import FALLBACK_TEXT, Activation, SnapshotError
from afterword.continuations.model import canonical_claim
from afterword.continuations.snapshot import decode_snapshot
from afterword.worker.synthesizers import SynthesisRequest, TemplateSynthesizer

pytestmark = pytest.mark.anyio

SERVER = "work-control"
CONV = "slack:C1:T1#2024-03-09"  # an explicit past-day rollover bucket
REPLY = "slack:C1:T1"
ORIGIN = [{"role": "user", "content": "please index the repo"}, {"role": "assistant", "content": "started"}]
EVIL = "slack:C_EVIL:T_EVIL"


class RecordingSynthesizer:
    """The template synthesizer, remembering what each synthesis turn was given."""

    def __init__(self) -> None:
        self.requests: list[SynthesisRequest] = []
        self._inner = TemplateSynthesizer()

    async def synthesize(self, request: SynthesisRequest) -> str:
        self.requests.append(request)
        return await self._inner.synthesize(request)


@dataclass
class Harness:
    service: ContinuationService
    client: httpx.AsyncClient
    config: Config
    synth: RecordingSynthesizer
    deadline: str = field(default_factory=lambda: deadline(1))

    def run(
        self, run_id: str = "run-1", conv: str = CONV, reply: str | None = REPLY, mode: str = "reply"
    ) -> RunBinding:
        return self.service.begin_run(run_id, conv, reply, mode)

    async def claim(
        self, binding: RunBinding | Mapping[str, str], task: str = "task-1", server: str = SERVER
    ) -> httpx.Response:
        """Claim with the binding's reserved values (or with ones captured earlier)."""
        env = binding.stdio_env(server) if isinstance(binding, RunBinding) else binding
        return await self.client.post(
            env["MONO_AGENT_CONTINUATION_CLAIM_URL"],
            headers={"Authorization": f"Bearer {env['MONO_AGENT_CONTINUATION_CLAIM_TOKEN']}"},
            json={"taskKey": task, "taskHash": "hash-1", "deadline": self.deadline},
        )

    async def claimed(
        self, binding: RunBinding, task: str = "task-1", server: str = SERVER
    ) -> dict[str, Any]:
        resp = await self.claim(binding, task, server)
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    async def submit(self, claim: Mapping[str, Any], summary: str = "Indexed 42 files") -> dict[str, Any]:
        payload = {"summary": summary}
        resp = await self.client.put(
            claim["resultUrl"],
            headers={"Authorization": f"Bearer {claim['resultToken']}"},
            json={"idempotencyKey": "result-1", "payloadHash": payload_hash(payload), "payload": payload},
        )
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    async def status(self, claim: Mapping[str, Any]) -> dict[str, Any]:
        resp = await self.client.get(
            claim["statusUrl"], headers={"Authorization": f"Bearer {claim['resultToken']}"}
        )
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    async def wait_delivered(self, claim: Mapping[str, Any]) -> dict[str, Any]:
        with anyio.fail_after(15):
            while True:
                body = await self.status(claim)
                if body["state"] in ("delivered", "dead_lettered", "delivery_unknown"):
                    return body
                await anyio.sleep(0.02)


@asynccontextmanager
async def serving(
    root: Path,
    *,
    run_worker: bool = False,
    config: Config | None = None,
    servers: Mapping[str, Any] | None = None,
    selected: list[str] | None = None,
    **continuations: Any,
) -> AsyncIterator[Harness]:
    if config is None:
        path = write_config(root, continuations=continuations, servers=servers, selected=selected)
        config = afterword.load_config(path, environ=ENV)
    synth = RecordingSynthesizer()
    async with (
        afterword.open_service(config, run_worker=run_worker, environ=ENV, synthesizer=synth) as service,
        httpx.AsyncClient(timeout=10) as client,
    ):
        yield Harness(service, client, config, synth)


def reserved_keys(mapping: Mapping[str, str], names: tuple[str, ...]) -> list[str]:
    wanted = {n.lower() for n in names}
    return [k for k in mapping if k.lower() in wanted]


# -- reserved names --------------------------------------------------------------------------
async def test_reserved_names_overwrite_configured_values(tmp_path: Path) -> None:
    servers = {
        SERVER: {
            "command": "python3",
            "env": {"MONO_AGENT_CONTINUATION_CLAIM_TOKEN": "configured-evil", "KEEP": "1"},
        },
        "helper": {"command": "python3", "env": {"MONO_AGENT_CONTINUATION_CLAIM_URL": "http://evil/"}},
        "web": {
            "url": "http://127.0.0.1:9/mcp",
            "headers": {"X-Mono-Agent-Continuation-Claim-Token": "evil"},
        },
    }
    async with serving(tmp_path, servers=servers, selected=[SERVER, "web"]) as h:
        binding = h.run()
        assert sorted(binding.servers) == sorted([SERVER, "web"])
        base = {
            **h.config.mcp_servers[SERVER].env,
            "mono_agent_continuation_claim_url": "http://evil.example/claim",
            "Mono_Agent_Continuation_Claim_Mode": "silent",
            "MONO_AGENT_CONTINUATION_CLAIM_FINGERPRINT": "forged",
        }
        before = dict(base)
        env = binding.stdio_env(SERVER, base)
        assert base == before  # the caller's mapping is not modified
        assert sorted(reserved_keys(env, RESERVED_ENV)) == sorted(RESERVED_ENV)  # each exactly once
        assert env["KEEP"] == "1"
        assert env["MONO_AGENT_CONTINUATION_CLAIM_URL"] == h.service.claim_url
        assert env["MONO_AGENT_CONTINUATION_CLAIM_MODE"] == "reply"
        assert env["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"] not in ("configured-evil", "")
        assert env["MONO_AGENT_CONTINUATION_CLAIM_FINGERPRINT"] != "forged"

        base_headers = {
            **h.config.mcp_servers["web"].headers,
            "x-mono-agent-continuation-claim-url": "http://evil.example/claim",
            "X-MONO-AGENT-CONTINUATION-CLAIM-MODE": "silent",
            "Authorization": "Bearer configured-server-credential",
        }
        headers = binding.http_headers("web", base_headers)
        assert sorted(reserved_keys(headers, RESERVED_HEADERS)) == sorted(RESERVED_HEADERS)
        assert headers["Authorization"] == "Bearer configured-server-credential"
        assert headers["x-mono-agent-continuation-claim-url"] == h.service.claim_url
        assert headers["x-mono-agent-continuation-claim-mode"] == "reply"
        web_token = headers["x-mono-agent-continuation-claim-token"]
        assert web_token != env["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]  # one capability per server

        # An unselected server gets no authority, and configured reserved values still vanish.
        helper = binding.stdio_env("helper", {**h.config.mcp_servers["helper"].env, "PATH": "/bin"})
        assert helper == {"PATH": "/bin"}
        assert binding.http_headers("helper", {"X-Mono-Agent-Continuation-Claim-Token": "x"}) == {}

        # The values written are the working ones, and each claims only as its own server.
        claim = await h.claimed(binding, "via-web", server="web")
        rec = h.service.repo.get(claim["continuationId"])
        assert rec is not None and rec.claim.server_name == "web"
        assert claim["fingerprint"] == headers["x-mono-agent-continuation-claim-fingerprint"]

        # After close the binding hands out nothing.
        await binding.close()
        assert reserved_keys(binding.stdio_env(SERVER, base), RESERVED_ENV) == []
        assert reserved_keys(binding.http_headers("web", base_headers), RESERVED_HEADERS) == []


async def test_claim_is_bound_to_the_run(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        binding = h.run(mode="notify_if_actionable")
        env = binding.stdio_env(SERVER)
        assert env["MONO_AGENT_CONTINUATION_CLAIM_MODE"] == "notify_if_actionable"
        claim = await h.claimed(binding)
        assert claim["fingerprint"] == env["MONO_AGENT_CONTINUATION_CLAIM_FINGERPRINT"]
        rec = h.service.repo.get(claim["continuationId"])
        assert rec is not None
        c = rec.claim
        assert (c.kind, c.server_name, c.run_id, c.conversation_id, c.reply_to, c.mode) == (
            "interactive",
            SERVER,
            "run-1",
            CONV,
            REPLY,
            "notify_if_actionable",
        )
        assert rec.origin_context == "pending"


async def test_begin_run_rules(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        from afterword.continuations import InvalidRequest

        for args in (("", CONV, REPLY, "reply"), ("r", "", REPLY, "reply"), ("r", CONV, None, "reply")):
            with pytest.raises(InvalidRequest):
                h.service.begin_run(*args)
        with pytest.raises(InvalidRequest):
            h.service.begin_run("r", CONV, REPLY, "broadcast")
        capture = h.run(reply=None, mode="capture")  # capture needs no physical route
        assert capture.stdio_env(SERVER)["MONO_AGENT_CONTINUATION_CLAIM_MODE"] == "capture"


# -- close and drain -------------------------------------------------------------------------
async def test_close_waits_for_a_claim_inside_admission(tmp_path: Path) -> None:
    """Deterministic race: a claim is paused after admission began (inside the service's
    hook, before its commit). close() must not return until that claim commits, and must
    report it; a claim that arrives once closing started is refused and creates nothing."""
    async with serving(tmp_path) as h:
        binding = h.run()
        env = binding.stdio_env(SERVER)  # what the server process received at spawn
        entered, release, closed = anyio.Event(), anyio.Event(), anyio.Event()
        out: dict[str, Any] = {}

        async def paused() -> None:
            entered.set()
            await release.wait()

        async def slow_claim() -> None:
            out["slow"] = await h.claim(env, "slow")

        async def close() -> None:
            out["active"] = await binding.close()
            closed.set()

        h.service.hooks.before_claim_commit = paused
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_claim)
            await entered.wait()
            h.service.hooks.before_claim_commit = None
            tg.start_soon(close)
            await anyio.wait_all_tasks_blocked()  # close() ran as far as it can: it must wait
            assert binding.closed and not closed.is_set()
            late = await h.claim(env, "late")  # admission is closed while draining
            assert late.status_code == 410 and late.json()["error"]["code"] == "closed"
            assert not closed.is_set()
            release.set()
            await closed.wait()
        assert out["slow"].status_code == 200, out["slow"].text
        cid = out["slow"].json()["continuationId"]
        assert out["active"] == [cid]
        after = await h.claim(env, "after")
        assert after.status_code == 410
        assert [r.claim.task_key for r in h.service.repo.live()] == ["slow"]


async def test_close_without_claims_returns_nothing(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        binding = h.run()
        assert await binding.close() == []
        assert await binding.finalize(ORIGIN) is None  # nothing needs origin context
        assert h.service.blobs.digests() == set()


# -- finalize --------------------------------------------------------------------------------
async def test_finalize_binds_one_snapshot_to_every_active_claim(tmp_path: Path) -> None:
    history = [
        *({"role": r, "content": f"{r} {i} " + "x" * 100} for i in range(40) for r in ("user", "assistant")),
        *ORIGIN,
    ]  # 82 messages: the oldest whole turns must go
    async with serving(tmp_path) as h:
        binding = h.run()
        a = await h.claimed(binding, "a")
        b = await h.claimed(binding, "b")
        assert sorted(await binding.close()) == sorted([a["continuationId"], b["continuationId"]])
        digest = await binding.finalize(history)
        assert digest is not None and digest in h.service.blobs.digests()
        snapshot = decode_snapshot(h.service.blobs.get(digest))
        assert snapshot.conversation_id == CONV  # exact bucket, not today's
        assert len(snapshot.messages) == 64
        assert [{"role": m.role, "content": m.content} for m in snapshot.messages] == history[-64:]
        assert snapshot.history_boundary == len(history)
        for claim in (a, b):
            rec = h.service.repo.get(claim["continuationId"])
            assert rec is not None and rec.snapshot_digest == digest and rec.snapshot_mac is not None
            h.service.blobs.verify_binding(digest, canonical_claim(rec.claim), rec.snapshot_mac)
            assert (await h.status(claim))["originContext"] == "pending"  # not yet committed
        await binding.activate()
        for claim in (a, b):
            assert (await h.status(claim))["originContext"] == "pinned"
        marker = h.service.repo.activation("run-1")
        assert marker is not None and sorted(marker.claim_ids) == sorted(
            [a["continuationId"], b["continuationId"]]
        )
        assert marker.conversation_id == CONV and marker.history_boundary == len(history)


async def test_finalize_fails_when_the_origin_pair_cannot_fit(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        binding = h.run()
        claim = await h.claimed(binding)
        huge = [{"role": "user", "content": "x" * (64 * 1024 + 1)}, {"role": "assistant", "content": "ok"}]
        with pytest.raises(SnapshotError):
            await binding.finalize(huge)
        with pytest.raises(SnapshotError):
            await binding.finalize([{"role": "user", "content": "no answer"}])
        rec = h.service.repo.get(claim["continuationId"])
        assert rec is not None and rec.snapshot_digest is None and rec.origin_context == "pending"
        assert h.service.blobs.digests() == set()


async def test_finalize_fails_on_blob_quota(tmp_path: Path) -> None:
    async with serving(tmp_path, run_worker=True) as h:
        # A quota with room for a blob already stored, but not for the snapshot as well.
        h.service.blobs = BlobStore(h.service.store.root, h.service.store.secret, quota=1024)
        h.service.blobs.put(b"x" * 1000)
        binding = h.run()
        claim = await h.claimed(binding)
        with pytest.raises(BlobQuotaExceeded):
            await binding.finalize(ORIGIN)
        rec = h.service.repo.get(claim["continuationId"])
        assert rec is not None and rec.snapshot_digest is None and rec.origin_context == "pending"
        # The host fails its turn and abandons: the producer's later result gets the fixed answer.
        await binding.abandon()
        await h.submit(claim)
        done = await h.wait_delivered(claim)
        assert done["completionKind"] == "origin_context_unavailable"
        assert h.synth.requests == []


# -- deferral, activation, abandon -----------------------------------------------------------
async def test_early_result_is_deferred_until_activation(tmp_path: Path) -> None:
    async with serving(tmp_path, run_worker=True) as h:
        binding = h.run()
        claim = await h.claimed(binding)
        accepted = await h.submit(claim)  # the producer finished before the origin turn did
        assert (accepted["state"], accepted["originContext"], accepted["deferred"]) == (
            "result_received",
            "pending",
            True,
        )
        worker = h.service.worker  # type: ignore[attr-defined]
        await worker.synthesize(claim["continuationId"])  # an explicit worker pass does nothing
        await binding.finalize([*ORIGIN])
        await worker.synthesize(claim["continuationId"])  # finalized is not yet committed
        await after_full_scan(worker)  # and the running worker loop looked at it (to act wrongly)
        status = await h.status(claim)
        assert (status["state"], status["originContext"], status["deferred"]) == (
            "result_received",
            "pending",
            True,
        )
        assert status["attempts"] == {"synthesis": 0, "delivery": 0}
        assert outbox_lines(h.config) == [] and h.synth.requests == []

        await binding.activate()
        done = await h.wait_delivered(claim)
        assert (done["state"], done["originContext"], done["completionKind"]) == (
            "delivered",
            "pinned",
            "synthesized",
        )
        assert done["deferred"] is False and done["receipt"]["kind"] == "posted"
        lines = outbox_lines(h.config)
        assert len(lines) == 1 and lines[0]["conversationId"] == REPLY
        assert "Indexed 42 files" in lines[0]["text"]
        # The synthesis turn saw the pinned snapshot of the exact bucket, tools disabled.
        (request,) = h.synth.requests
        assert request.conversation_id == CONV and request.origin_context == "pinned"
        assert [(m.role, m.content) for m in request.messages][-2:] == [
            (m["role"], m["content"]) for m in ORIGIN
        ]
        assert request.tools_disabled and request.payload == {"summary": "Indexed 42 files"}


async def test_silent_mode_is_deferred_too(tmp_path: Path) -> None:
    async with serving(tmp_path, run_worker=True) as h:
        binding = h.run(reply=None, mode="silent")
        claim = await h.claimed(binding)
        accepted = await h.submit(claim)
        assert (accepted["state"], accepted["deferred"]) == ("result_received", True)
        await h.service.worker.synthesize(claim["continuationId"])  # type: ignore[attr-defined]
        assert (await h.status(claim))["state"] == "result_received"
        await binding.finalize(ORIGIN)
        await binding.activate()
        done = await h.wait_delivered(claim)
        assert (done["state"], done["completionKind"]) == ("delivered", "silent")
        assert outbox_lines(h.config) == [] and h.synth.requests == []


async def test_abandon_delivers_the_fixed_fallback(tmp_path: Path) -> None:
    async with serving(tmp_path, run_worker=True) as h:
        binding = h.run()
        claim = await h.claimed(binding)
        await h.submit(claim)
        await binding.finalize(ORIGIN)  # even with a snapshot bound, a failed origin abandons it
        await binding.abandon()
        assert binding.settled == "abandoned"
        done = await h.wait_delivered(claim)
        assert (done["state"], done["originContext"], done["completionKind"]) == (
            "delivered",
            "abandoned",
            "origin_context_unavailable",
        )
        lines = outbox_lines(h.config)
        assert [line["text"] for line in lines] == [FALLBACK_TEXT]
        assert lines[0]["conversationId"] == REPLY
        assert h.synth.requests == []  # no model call for a lost origin


async def test_settlement_is_final(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        binding = h.run()
        claim = await h.claimed(binding)
        await binding.finalize(ORIGIN)
        await binding.activate()
        await binding.abandon()  # too late: the origin already committed
        assert (await h.status(claim))["originContext"] == "pinned"


# -- restart recovery ------------------------------------------------------------------------
async def test_run_never_activated_before_restart_is_abandoned(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        config = h.config
        binding = h.run()
        claim = await h.claimed(binding)
        await binding.finalize(ORIGIN)  # the process dies before the origin commit
    async with serving(tmp_path, config=config, run_worker=True) as h:
        assert (await h.status(claim))["originContext"] == "abandoned"
        await h.submit(claim)
        done = await h.wait_delivered(claim)
        assert done["completionKind"] == "origin_context_unavailable"
        assert [line["text"] for line in outbox_lines(h.config)] == [FALLBACK_TEXT]


async def test_restart_completes_a_durable_activation_marker(tmp_path: Path) -> None:
    """The activation marker is the commit point: a record still pending when the process
    stopped, but named by a durable marker, is materialized as pinned at the next start."""
    async with serving(tmp_path) as h:
        config = h.config
        binding = h.run()
        claim = await h.claimed(binding)
        await binding.finalize(ORIGIN)
        marker = Activation(
            run_id="run-1",
            conversation_id=CONV,
            history_boundary=2,
            activated_at_ms=h.service.clock_ms(),
            claim_ids=(claim["continuationId"],),
        )
        await h.service.store.transact([h.service.repo.activation_put("run-1", marker)])
        assert (await h.status(claim))["originContext"] == "pending"
    async with serving(tmp_path, config=config) as h:
        assert (await h.status(claim))["originContext"] == "pinned"

"""The host API over HTTP: what only a remote host needs (idempotent begin, its own
capability, the run lease), the CLI that hands out the capability, the lease setting, and
every status the host operations document. Behaviour shared with the in-process handle is
in test_host_parity.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from _service import ENV, outbox_lines, payload_hash, write_config
from test_http_protocol import CONV, REPLY, SERVER, Clock, Harness, assert_error, auth, serving
from test_openapi import Seen

import afterword
from afterword.app.hostruns import host_runs
from afterword.app.leases import check_interval_s, lapsed, lease_state
from afterword.app.runs import CLAIM_CAPABILITY_TTL_MS
from afterword.cli import main as cli_main
from afterword.clients.operator import read_host_token, read_operator_token
from afterword.config import ConfigError
from afterword.continuations import FALLBACK_TEXT
from afterword.continuations.model import ErrorInfo
from afterword.http.operations import HOST_OPERATIONS

pytestmark = pytest.mark.anyio
ORIGIN = [{"role": "user", "content": "index the repo"}, {"role": "assistant", "content": "started"}]
LEASE_MS = 2000


class Api:
    def __init__(self, h: Harness) -> None:
        self.h = h
        self.base = h.service.base_url + "/v1/host"
        self.auth = auth(read_host_token(h.config))

    async def post(self, path: str, body: Any = None, token: dict[str, str] | None = None) -> httpx.Response:
        kw: dict[str, Any] = {} if body is None else {"json": body}
        return await self.h.client.post(self.base + path, headers=self.auth if token is None else token, **kw)

    async def get(self, path: str) -> httpx.Response:
        return await self.h.client.get(self.base + path, headers=self.auth)

    async def begin(self, run_id: str = "run-1", **extra: Any) -> dict[str, Any]:
        resp = await self.post("/runs", {"runId": run_id, "conversationId": CONV, "replyTo": REPLY, **extra})
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    async def claim(self, run: dict[str, Any], task: str = "task-1") -> dict[str, Any]:
        env = run["servers"][0]["env"]
        resp = await self.h.claim(env["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"], task)
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    async def submit(self, claim: dict[str, Any]) -> None:
        payload = {"summary": "Indexed 42 files"}
        body = {"idempotencyKey": "r1", "payloadHash": payload_hash(payload), "payload": payload}
        resp = await self.h.client.put(claim["resultUrl"], headers=auth(claim["resultToken"]), json=body)
        assert resp.status_code == 200, resp.text


async def test_begin_is_idempotent_and_a_changed_repeat_conflicts(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        api = Api(h)
        first = await api.begin()
        assert first["state"] == "open" and first["abandonReason"] is None
        (server,) = first["servers"]
        assert server["server"] == SERVER and len(server["env"]) == 4 and len(server["headers"]) == 4
        again = await api.begin()
        assert again["servers"] == first["servers"]  # the same capability, not a second one
        assert_error(
            await api.post("/runs", {"runId": "run-1", "conversationId": CONV, "replyTo": "x:y"}),
            409,
            "conflict",
        )
        claim = await api.claim(first)
        got = (await api.get("/runs/run-1")).json()
        assert [c["continuationId"] for c in got["claims"]] == [claim["continuationId"]]
        assert got["claims"][0]["originContext"] == "pending"
        closed = (await api.post("/runs/run-1/close")).json()
        assert closed["state"] == "closed" and closed["servers"][0]["env"] == {}
        assert_error(await api.get("/runs/nope"), 404, "not_found")
        # Unknown fields are refused, as on every other route.
        body = {"runId": "r2", "conversationId": CONV, "replyTo": REPLY, "channel": "slack:EVIL"}
        assert_error(await api.post("/runs", body), 400, "invalid_request")
        assert_error(
            await api.post("/runs/run-1/finalize", {"history": ORIGIN, "x": 1}), 400, "invalid_request"
        )


async def test_only_the_host_capability_opens_the_host_api(tmp_path: Path) -> None:
    async with serving(tmp_path, run_worker=True) as h:
        api = Api(h)
        operator = auth(read_operator_token(h.config))
        host = api.auth
        assert host != operator
        run = await api.begin("cap", replyTo=None, mode="capture")
        claim_token = auth(run["servers"][0]["env"]["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"])
        for token in (operator, claim_token, auth("awh1.forged"), {}):
            assert_error(
                await api.post("/runs", {"runId": "x", "conversationId": CONV}, token), 401, "unauthorized"
            )
            resp = await h.client.get(api.base + "/health", headers=token)
            assert_error(resp, 401, "unauthorized")
        # ...and the host capability opens nothing of the operator's.
        assert_error(
            await h.client.get(h.service.base_url + "/v1/operator/health", headers=host), 401, "unauthorized"
        )
        # Captured text: on the host API, never on an operator surface.
        claim = await api.claim(run)
        await api.post("/runs/cap/finalize", {"history": ORIGIN})
        await api.post("/runs/cap/activate")
        await api.submit(claim)
        cid = claim["continuationId"]
        with anyio.fail_after(15):
            while h.service.captured_continuation_text(cid) is None:
                await anyio.sleep(0.02)
        text = (await api.get(f"/continuations/{cid}/captured-text")).json()["text"]
        assert "Indexed 42 files" in text
        resp = await h.client.get(f"{api.base}/continuations/{cid}/captured-text", headers=operator)
        assert_error(resp, 401, "unauthorized")
        for path in (f"/v1/operator/continuations/{cid}", "/v1/operator/continuations"):
            body = (await h.client.get(h.service.base_url + path, headers=operator)).text
            assert "Indexed 42 files" not in body


# -- leases ----------------------------------------------------------------------------------
def test_lease_decision() -> None:
    assert lease_state(1000, False, 999) == "live"
    assert lease_state(1000, False, 1000) == "lapsed"
    assert lease_state(1000, True, 5000) == "settled"
    assert lapsed([("a", 10, False), ("b", 30, False), ("c", 5, True)], 20) == ["a"]
    assert check_interval_s(60_000) == 1.0 and check_interval_s(400) == 0.1


async def test_a_lapsed_lease_abandons_the_run_and_heartbeats_renew_it(tmp_path: Path) -> None:
    clock = Clock()
    async with serving(tmp_path, run_worker=True, clock=clock, limits={"runLeaseMs": 60_000}) as h:
        api = Api(h)
        runs = host_runs(h.service)
        kept, lost = await api.begin("kept"), await api.begin("lost")
        kept_claim, lost_claim = await api.claim(kept, "k"), await api.claim(lost, "l")
        await api.submit(lost_claim)
        for _ in range(3):  # heartbeats keep "kept" alive across three leases' worth of time
            clock.offset_ms += 45_000
            beat = await api.post("/runs/kept/heartbeat")
            assert beat.status_code == 200 and beat.json()["state"] == "open"
        await runs.expire_lapsed()  # (the service's own loop may have got there first)
        body = (await api.get("/runs/lost")).json()
        assert (body["state"], body["abandonReason"]) == ("abandoned", "lease_lapsed")
        assert h.service.repo.get(kept_claim["continuationId"]).origin_context == "pending"  # type: ignore[union-attr]
        # Its result takes the spec's fixed fallback, with no model call.
        with anyio.fail_after(15):
            while not outbox_lines(h.config):
                await anyio.sleep(0.02)
        assert [line["text"] for line in outbox_lines(h.config)] == [FALLBACK_TEXT]
        # The host learns it when it comes back: settling a lapsed run is refused.
        assert_error(await api.post("/runs/lost/activate"), 410, "closed")
        assert_error(await api.post("/runs/lost/heartbeat"), 410, "closed")
        # A lapse is applied by the next call on the run even before the loop gets to it.
        clock.offset_ms += 60_000
        msg = assert_error(await api.post("/runs/kept/finalize", {"history": ORIGIN}), 410, "closed")
        assert "lease lapsed" in msg


async def test_the_lease_loop_abandons_without_any_call(tmp_path: Path) -> None:
    clock = Clock()
    async with serving(tmp_path, clock=clock, limits={"runLeaseMs": 400}) as h:
        api = Api(h)
        run = await api.begin()
        claim = await api.claim(run)
        activated = await api.begin("activated")
        await api.post("/runs/activated/activate")
        clock.offset_ms += 10_000
        with anyio.fail_after(10):
            while h.service.repo.get(claim["continuationId"]).origin_context == "pending":  # type: ignore[union-attr]
                await anyio.sleep(0.05)
        assert h.service.repo.get(claim["continuationId"]).origin_context == "abandoned"  # type: ignore[union-attr]
        assert activated["runId"] == "activated"
        assert (await api.get("/runs/activated")).json()["state"] == "activated"  # no lease after activation


async def test_a_lapse_that_fails_does_not_stop_the_others(tmp_path: Path) -> None:
    clock = Clock()
    async with serving(tmp_path, clock=clock) as h:
        api = Api(h)
        runs = host_runs(h.service)
        await api.begin("bad")
        await api.begin("good")

        async def broken() -> None:
            raise OSError("the disk went away")

        runs.get("bad").binding.abandon = broken  # type: ignore[method-assign]
        clock.offset_ms += 120_000
        await runs.expire_lapsed()
        assert (runs.get("bad").state, runs.get("good").state) == ("open", "abandoned")


# -- the cap on open runs --------------------------------------------------------------------
async def test_open_runs_are_capped_and_slots_free_on_settlement_and_lapse(tmp_path: Path) -> None:
    clock = Clock()
    async with serving(tmp_path, clock=clock, limits={"maxOpenRuns": 2, "runLeaseMs": LEASE_MS}) as h:
        api = Api(h)
        runs = host_runs(h.service)
        await api.begin("r1")
        await api.begin("r2")
        refused = await api.post("/runs", {"runId": "r3", "conversationId": CONV, "replyTo": REPLY})
        msg = assert_error(refused, 429, "admission_limit")
        assert "maxOpenRuns" in msg
        # Retry-After: when the first open lease would lapse (the whole lease here).
        assert int(refused.headers["Retry-After"]) == LEASE_MS // 1000
        assert (await api.get("/runs/r3")).status_code == 404  # nothing was bound
        # An identical repeat of an open run is not a new run: it succeeds at the cap.
        assert (await api.begin("r1"))["state"] == "open"
        # Abandoning frees a slot, and so does activating.
        assert (await api.post("/runs/r1/abandon")).status_code == 200
        await api.begin("r3")
        assert_error(
            await api.post("/runs", {"runId": "r4", "conversationId": CONV, "replyTo": REPLY}),
            429,
            "admission_limit",
        )
        assert (await api.post("/runs/r2/activate")).status_code == 200
        await api.begin("r4")
        assert runs.open_count == 2
        # A lapse frees slots even before the lease loop gets to it: begin applies it first.
        clock.offset_ms += LEASE_MS + 1
        await api.begin("r5")
        for gone in ("r3", "r4"):
            body = (await api.get(f"/runs/{gone}")).json()
            assert (body["state"], body["abandonReason"]) == ("abandoned", "lease_lapsed")
        assert runs.open_count == 1
        # Settled runs are remembered up to the same count, the oldest settled forgotten first.
        assert (await api.get("/runs/r1")).status_code == 404
        assert (await api.get("/runs/r2")).status_code == 404
        assert "open=1/2" in repr(runs)


async def test_concurrent_begins_never_exceed_the_cap(tmp_path: Path) -> None:
    async with serving(tmp_path, limits={"maxOpenRuns": 5}) as h:
        api = Api(h)
        statuses: list[int] = []

        async def one(i: int) -> None:
            resp = await api.post("/runs", {"runId": f"c{i}", "conversationId": CONV, "replyTo": REPLY})
            statuses.append(resp.status_code)

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
        assert sorted(statuses) == [200] * 5 + [429] * 15
        assert host_runs(h.service).open_count == 5


async def test_an_embedded_host_that_never_closes_does_not_grow_the_registry(tmp_path: Path) -> None:
    """The in-process handle: bindings dropped without close() are forgotten once their
    capabilities expire, at the next begin_run (before, only close() forgot any)."""
    clock = Clock()
    async with serving(tmp_path, clock=clock) as h:
        registry = h.service._runs.capabilities
        for i in range(50):
            h.service.begin_run(f"dropped-{i}", CONV, REPLY)
        assert len(registry) == 50
        clock.offset_ms += CLAIM_CAPABILITY_TTL_MS + 1
        kept = h.service.begin_run("kept", CONV, REPLY)
        assert len(registry) == 1
        # The live one still claims.
        token = kept.stdio_env(SERVER)["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]
        assert (await h.claim(token, "t-kept")).status_code == 200


# -- configuration and CLI -------------------------------------------------------------------
def test_max_open_runs_setting_is_validated(tmp_path: Path) -> None:
    assert afterword.load_config(write_config(tmp_path), environ=ENV).limits.max_open_runs == 1000
    for value in (0, -3):
        path = write_config(tmp_path, continuations={"limits": {"maxOpenRuns": value}})
        with pytest.raises(ConfigError) as caught:
            afterword.load_config(path, environ=ENV)
        assert str(caught.value).startswith("continuations.limits.maxOpenRuns: must be a positive integer")
    path = write_config(tmp_path, continuations={"limits": {"maxOpenRuns": 7}})
    assert afterword.load_config(path, environ=ENV).limits.max_open_runs == 7


def test_run_lease_setting_is_validated(tmp_path: Path) -> None:
    for value, problem in ((0, "positive integer"), (3_600_001, "at most 3600000")):
        path = write_config(tmp_path, continuations={"limits": {"runLeaseMs": value}})
        with pytest.raises(ConfigError) as caught:
            afterword.load_config(path, environ=ENV)
        assert str(caught.value).startswith("continuations.limits.runLeaseMs: ") and problem in str(
            caught.value
        )
    path = write_config(tmp_path, continuations={"limits": {"runLeaseMs": 5000}})
    assert afterword.load_config(path, environ=ENV).limits.run_lease_ms == 5000


async def test_host_token_is_written_owner_only_and_never_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serving(tmp_path) as h:
        token = read_host_token(h.config)
        config = str(Path(h.config.config_dir) / "afterword.json")
        target = tmp_path / "host.token"
        assert cli_main(["continuations", "host-token", "--config", config, "--file", str(target)]) == 0
        assert target.read_text() == token and stat.S_IMODE(target.stat().st_mode) == 0o600
        out = capsys.readouterr()
        assert token not in out.out + out.err and str(target) in out.out
        # A safe existing file is replaced; a symlink or a hard link is refused, untouched.
        target.write_text("old")
        assert cli_main(["continuations", "host-token", "--config", config, "--file", str(target)]) == 0
        assert target.read_text() == token
        victim = tmp_path / "victim"
        victim.write_text("keep")
        link = tmp_path / "link.token"
        link.symlink_to(victim)
        hard = tmp_path / "hard.token"
        os.link(victim, hard)
        folder = tmp_path / "a-folder"
        folder.mkdir()
        for path, why in (
            (link, "it is a symlink"),
            (hard, "other hard links"),
            (folder, "it is a directory"),
        ):
            code = cli_main(["continuations", "host-token", "--config", config, "--file", str(path)])
            assert code == 1
            err = capsys.readouterr().err
            assert "refusing to replace" in err and why in err
        assert victim.read_text() == "keep"
        # The file's token opens the host API.
        resp = await h.client.get(h.service.base_url + "/v1/host/health", headers=auth(target.read_text()))
        assert resp.status_code == 200


# -- the document ----------------------------------------------------------------------------
async def test_every_documented_host_status_is_reachable(tmp_path: Path) -> None:
    # A loopback HTTP server besides the stdio one, after it in name order (claims use the first).
    servers = {
        SERVER: {"command": "python3", "args": ["-c", "pass"]},
        "zz-tasks": {"url": "http://127.0.0.1:9/mcp"},
    }
    limits = {"bodyTimeoutMs": 300, "maxOpenRuns": 1}
    path = write_config(
        tmp_path, continuations={"limits": limits}, servers=servers, selected=[SERVER, "zz-tasks"]
    )
    async with serving(tmp_path, config=afterword.load_config(path, environ=ENV)) as h:
        s = Seen(h)
        api = Api(h)
        host, js = api.auth, {"Content-Type": "application/json"}
        big = b"x" * 300_000
        for o in HOST_OPERATIONS:
            path = o.path.replace("{cid}", "c_x").replace("{runId}", "r")
            await s.send(o.method, path, 400, headers={"Host": "evil.example"})
            await s.send(o.method, path, 401)
        rp = "/v1/host/runs"
        begin = {"runId": "run-1", "conversationId": CONV, "replyTo": REPLY}
        run = (await s.send("post", rp, 200, json=begin, headers=host)).json()
        await s.send("post", rp, 409, json={**begin, "replyTo": "x:y"}, headers=host)
        await s.send("post", rp, 429, json={**begin, "runId": "run-over"}, headers=host)
        await s.send("post", rp, 413, content=big, headers={**host, **js})
        await s.trickle("POST", rp, {**host, **js})
        for verb in ("heartbeat", "close", "finalize", "activate", "abandon"):
            await s.send("post", f"{rp}/none/{verb}", 404, json={"history": ORIGIN}, headers=host)
        await s.send("get", f"{rp}/none", 404, headers=host)
        await s.send("get", f"{rp}/run-1", 200, headers=host)
        claim = await api.claim(run)
        await s.send("post", f"{rp}/run-1/heartbeat", 200, headers=host)
        await s.send("post", f"{rp}/run-1/close", 200, headers=host)
        await s.send("post", f"{rp}/run-1/finalize", 413, content=b"x" * 1_100_000, headers={**host, **js})
        await s.trickle("POST", f"{rp}/run-1/finalize", {**host, **js})
        await s.send("post", f"{rp}/run-1/finalize", 400, json={"history": ORIGIN[:1]}, headers=host)
        await s.send("post", f"{rp}/run-1/finalize", 200, json={"history": ORIGIN}, headers=host)
        await s.send("post", f"{rp}/run-1/abandon", 200, headers=host)
        await s.send("post", f"{rp}/run-1/finalize", 410, json={"history": ORIGIN}, headers=host)
        await s.send("post", f"{rp}/run-1/activate", 410, headers=host)
        await s.send("post", f"{rp}/run-1/heartbeat", 410, headers=host)
        run2 = (await s.send("post", rp, 200, json={**begin, "runId": "run-2"}, headers=host)).json()
        await api.claim(run2, "t2")
        await s.send("post", f"{rp}/run-2/activate", 200, headers=host)

        cid, hc = claim["continuationId"], "/v1/host/continuations"
        await s.send("get", "/v1/host/health", 200, headers=host)
        await s.send("get", hc + "?limit=1", 200, headers=host)
        await s.send("get", hc + "?limit=x", 400, headers=host)
        await s.send("get", f"{hc}/{cid}/captured-text", 200, headers=host)
        await s.send("get", f"{hc}/c_none/captured-text", 404, headers=host)
        # -- MCP task adoption and outcomes (docs/tasks-bridge.md) --
        tp, handle = f"{rp}/run-3/tasks", {"server": SERVER, "taskId": "t-1", "status": "working"}
        await s.send("post", rp, 200, json={**begin, "runId": "run-3"}, headers=host)
        task = (await s.send("post", tp, 200, json=handle, headers=host)).json()
        await s.send("post", tp, 400, json={**handle, "taskId": "a\nb"}, headers=host)
        await s.send("post", f"{rp}/none/tasks", 404, json=handle, headers=host)
        await s.send("post", tp, 413, content=big, headers={**host, **js})
        await s.trickle("POST", tp, {**host, **js})
        h.service._tasks.sdk_available = lambda: False
        await s.send("post", tp, 503, json={**handle, "server": "zz-tasks"}, headers=host)
        h.service._claims.admitting_total += 10**6  # as if that many claims were being admitted
        await s.send("post", tp, 429, json={**handle, "taskId": "t-2"}, headers=host)
        h.service._claims.admitting_total -= 10**6
        await s.send("post", f"{rp}/run-3/close", 200, headers=host)
        await s.send("post", tp, 409, json={**handle, "taskId": "t-3"}, headers=host)
        await s.send("post", f"{rp}/run-2/tasks", 410, json=handle, headers=host)
        top = f"{hc}/{task['continuationId']}/task-outcome"
        await s.send("post", top, 200, json={"status": "working"}, headers=host)
        await s.send("post", top, 400, json={"status": "exploded"}, headers=host)
        await s.send("post", f"{hc}/c_none/task-outcome", 404, json={"status": "working"}, headers=host)
        await s.send("post", top, 413, content=b"x" * 4_300_000, headers={**host, **js})
        await s.trickle("POST", top, {**host, **js})
        await s.send("post", f"{hc}/{cid}/task-outcome", 409, json={"status": "working"}, headers=host)
        for verb in ("retry", "cancel", "resolve"):
            body = {"kind": "not_delivered"} if verb == "resolve" else {}
            await s.send("post", f"{hc}/c_none/{verb}", 404, json=body, headers=host)
            if verb != "cancel":
                await s.send("post", f"{hc}/{cid}/{verb}", 409, json=body, headers=host)  # still active
                await s.send("post", f"{hc}/{cid}/{verb}", 413, content=big, headers={**host, **js})
                await s.trickle("POST", f"{hc}/{cid}/{verb}", {**host, **js})

        async def force(state: str, **extra: Any) -> None:
            rec = h.service.repo.get(cid)
            assert rec is not None
            new = msgspec.structs.replace(rec, state=state, terminal_at_ms=rec.updated_at_ms, **extra)
            await h.service.commit([(rec, new)])

        await api.submit(claim)
        await force("dead_lettered", last_error=ErrorInfo.bounded("synthesis_failed", "x"))
        await s.send("post", f"{hc}/{cid}/cancel", 409, headers=host)
        await s.send("post", f"{hc}/{cid}/retry", 200, json={"allowUnknown": False}, headers=host)
        await force("delivery_unknown")
        await s.send("post", f"{hc}/{cid}/resolve", 200, json={"kind": "not_delivered"}, headers=host)
        other = run2["claims"][0]["continuationId"] if run2["claims"] else None
        other = other or (await api.get("/runs/run-2")).json()["claims"][0]["continuationId"]
        await s.send("post", f"{hc}/{other}/cancel", 200, headers=host)
        # Compacted by retention: the verbs answer 410 compacted (show still has it).
        await force("expired")
        await h.service.apply_retention()
        assert h.service.repo.get(cid) is None and h.service.repo.tombstone(cid) is not None
        for verb in ("retry", "cancel", "resolve"):
            body = {"kind": "not_delivered"} if verb == "resolve" else {}
            r = await s.send("post", f"{hc}/{cid}/{verb}", 410, json=body, headers=host)
            assert r.json()["error"]["code"] == "compacted"

        documented = {(o.method, o.path, st) for o in HOST_OPERATIONS for st in (200, *o.errors)}
        assert documented <= s.pairs, sorted(documented - s.pairs)
        assert s.pairs <= documented, sorted(s.pairs - documented)


async def test_finalize_takes_a_history_larger_than_the_snapshot_and_only_finalize_does(
    tmp_path: Path,
) -> None:
    # 40 turns of ~16 KiB each: about 640 KiB of JSON, more than the 256 KiB a snapshot keeps.
    # The host may send it whole; size pressure drops the oldest turns, and every other route
    # keeps the app-wide cap.
    history: list[dict[str, str]] = []
    for i in range(40):
        history += [
            {"role": "user", "content": f"q{i} " + "u" * 8000},
            {"role": "assistant", "content": f"a{i} " + "a" * 8000},
        ]
    history += ORIGIN
    async with serving(tmp_path) as h:
        api = Api(h)
        run = await api.begin()
        await api.claim(run)
        assert (await api.post("/runs/run-1/close")).status_code == 200
        resp = await api.post("/runs/run-1/finalize", {"history": history})
        assert resp.status_code == 200, resp.text
        assert resp.json()["snapshotDigest"]
        big_claim = {"runId": "run-2", "conversationId": CONV, "replyTo": REPLY, "pad": "x" * 600_000}
        assert_error(await api.post("/runs", big_claim), 413, "too_large")
        assert_error(await api.post("/runs/run-1/finalize", {"history": history * 2}), 413, "too_large")

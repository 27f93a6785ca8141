"""Host helpers: reserved values written last and only for selected servers, selection
re-checked before anything starts, and the settle order (abandon when the commit fails)."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
import pytest
from _service import ENV, deadline, load, write_config

import afterword
from afterword.app.binding import RESERVED_ENV, RESERVED_HEADERS
from afterword.config import ConfigError
from afterword.mcp_host import McpHostError, connect_servers, http_client, settle_run, stdio_parameters
from afterword.producer import task_hash
from afterword.protocol.wire import ClaimRequest

HISTORY = [{"role": "user", "content": "start it"}, {"role": "assistant", "content": "started"}]
COPIED = {
    "MONO_AGENT_CONTINUATION_CLAIM_URL": "http://127.0.0.1:1/steal",
    "mono_agent_continuation_claim_token": "copied-token",
    "MONO_AGENT_CONTINUATION_CLAIM_MODE": "capture",
}
COPIED_HEADERS = {
    "X-Mono-Agent-Continuation-Claim-Token": "copied-token",
    "x-mono-agent-continuation-claim-fingerprint": "forged",
    "Authorization": "Bearer server-own-credential",
}


def servers(marker: Path | None = None) -> dict[str, object]:
    touch = f"open({str(marker)!r}, 'w').close()" if marker else "pass"
    return {
        "work-control": {"command": sys.executable, "args": ["-c", "pass"], "env": {**COPIED, "KEEP": "1"}},
        "plain": {"command": sys.executable, "args": ["-c", touch], "env": dict(COPIED)},
        "web": {"url": "http://127.0.0.1:9/mcp", "headers": dict(COPIED_HEADERS)},
        "remote": {"url": "https://tools.example.com/mcp", "headers": dict(COPIED_HEADERS)},
        "legacy": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
    }


@pytest.mark.anyio
async def test_stdio_env_discards_configured_reserved_values_and_writes_the_bound_ones(
    tmp_path: Path,
) -> None:
    config = load(write_config(tmp_path, servers=servers(), selected=["work-control", "web"]))
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat", "local:chat")
        params = stdio_parameters(binding, config.mcp_servers["work-control"], inherit={"PATH": "/bin"})
        env = params.env or {}
        assert env["KEEP"] == "1" and env["PATH"] == "/bin"
        assert env["MONO_AGENT_CONTINUATION_CLAIM_URL"] == service.claim_url
        assert env["MONO_AGENT_CONTINUATION_CLAIM_MODE"] == "reply"
        assert "mono_agent_continuation_claim_token" not in env
        assert env["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"] not in ("copied-token", "")
        assert params.command == sys.executable and params.args == ["-c", "pass"]

        # Not selected: every reserved name is removed, whatever the config said.
        plain = stdio_parameters(binding, config.mcp_servers["plain"], inherit={})
        assert not {k.upper() for k in plain.env or {}} & set(RESERVED_ENV)

        # Once the run is closed, a server started late gets nothing either.
        await binding.close()
        late = stdio_parameters(binding, config.mcp_servers["work-control"], inherit={})
        assert not set(late.env or {}) & set(RESERVED_ENV)


@pytest.mark.anyio
async def test_http_client_headers(tmp_path: Path) -> None:
    config = load(write_config(tmp_path, servers=servers(), selected=["web"]))
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat", "local:chat")
        async with http_client(binding, config.mcp_servers["web"]) as client:
            headers = {k.lower(): v for k, v in client.headers.items()}
            assert headers["authorization"] == "Bearer server-own-credential"
            assert headers["x-mono-agent-continuation-claim-url"] == service.claim_url
            assert headers["x-mono-agent-continuation-claim-token"] != "copied-token"
            assert headers["x-mono-agent-continuation-claim-fingerprint"] != "forged"
            assert client.follow_redirects is False and client.trust_env is False
        # An unlisted remote server may still be used as a plain MCP server, without authority.
        async with http_client(binding, config.mcp_servers["remote"]) as client:
            assert not {k.lower() for k in client.headers} & set(RESERVED_HEADERS)
            assert client.headers["authorization"] == "Bearer server-own-credential"
        with pytest.raises(McpHostError):
            http_client(binding, config.mcp_servers["plain"])


class HeaderRecorder:
    """A loopback HTTP listener that records the headers of every request it receives."""

    def __init__(self) -> None:
        self.seen: list[dict[str, list[str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received: dict[str, list[str]] = {}
                for name, value in self.headers.items():
                    received.setdefault(name.lower(), []).append(value)
                outer.seen.append(received)
                self.send_response(204)
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/mcp"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.mark.anyio
async def test_reserved_headers_are_written_after_every_per_request_header_layer(tmp_path: Path) -> None:
    """The SDK merges its per-request headers (on 2.x also Mcp-Param-* mirrored from tool
    arguments a model chose) over the client's defaults; a reserved name in any of those
    layers must not reach the server, and the run's own values must."""
    recorder = HeaderRecorder()
    try:
        both = {**servers(), "web": {"url": recorder.url}, "other": {"url": recorder.url}}
        config = load(write_config(tmp_path, servers=both, selected=["web"]))
        async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
            binding = service.begin_run("run-1", "local:chat", "local:chat")
            bound = {k: v for k, v in binding.http_headers("web").items() if k in RESERVED_HEADERS}
            assert len(bound) == 4
            per_request = {**COPIED_HEADERS, "X-MONO-AGENT-CONTINUATION-CLAIM-MODE": "capture"}
            async with http_client(binding, config.mcp_servers["web"]) as client:
                await client.post(recorder.url, content=b"{}", headers=per_request)
            async with http_client(binding, config.mcp_servers["other"]) as client:
                await client.post(recorder.url, content=b"{}", headers=per_request)
        selected, unselected = recorder.seen
        for name, value in bound.items():
            assert selected[name] == [value]
        assert not set(unselected) & set(RESERVED_HEADERS)
        # Headers that are not reserved pass through untouched.
        assert selected["authorization"] == unselected["authorization"] == ["Bearer server-own-credential"]
    finally:
        recorder.close()


@pytest.mark.parametrize("bad", ["remote", "legacy"])
def test_remote_or_sse_selection_fails_when_the_config_loads(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(write_config(tmp_path, servers=servers(), selected=["work-control", bad]))
    assert info.value.path == "tools.continuationServers[1]"


@pytest.mark.anyio
@pytest.mark.parametrize("bad", ["remote", "legacy"])
async def test_hand_built_selection_fails_before_any_server_starts(tmp_path: Path, bad: str) -> None:
    marker = tmp_path / "started"
    config = load(write_config(tmp_path, servers=servers(marker), selected=["work-control"]))
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat", "local:chat")
        forged = msgspec.structs.replace(config, continuation_servers=("work-control", bad))
        with pytest.raises(ConfigError) as info:
            async with connect_servers(binding, forged, ["plain"]):
                pass
        assert bad in str(info.value)
        # The same holds for a selected remote server handed straight to http_client.
        remote = msgspec.structs.replace(config.mcp_servers["remote"], name="work-control")
        with pytest.raises(ConfigError):
            http_client(binding, remote)
        # And for a transport the helpers cannot start, listed after one they can.
        with pytest.raises(McpHostError):
            async with connect_servers(binding, config, ["plain", "legacy"]):
                pass
    assert not marker.exists()


@pytest.mark.anyio
async def test_settle_run_abandons_when_the_host_commit_fails(tmp_path: Path) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat", "local:chat")
        token = binding.stdio_env("work-control")["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]
        claim = await service.claim(
            token, ClaimRequest(task_key="t1", task_hash=task_hash(1), deadline=deadline())
        )
        phases: list[str] = []

        async def failing_commit() -> None:
            raise OSError("history disk full")

        with pytest.raises(OSError):
            await settle_run(binding, HISTORY, failing_commit, on_phase=lambda p, _s: phases.append(p))
        assert phases == ["closed", "finalized"]
        assert binding.settled == "abandoned"
        (item,) = service.list_continuations().items
        assert (item.continuation_id, item.origin_context) == (claim.continuation_id, "abandoned")


@pytest.mark.anyio
async def test_settle_run_order(tmp_path: Path) -> None:
    config = load(write_config(tmp_path))
    async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False) as service:
        binding = service.begin_run("run-1", "local:chat", "local:chat")
        token = binding.stdio_env("work-control")["MONO_AGENT_CONTINUATION_CLAIM_TOKEN"]
        claim = await service.claim(
            token, ClaimRequest(task_key="t1", task_hash=task_hash(1), deadline=deadline())
        )
        seen: list[tuple[str, str]] = []

        async def commit() -> None:
            # At commit time the snapshot is bound but the origin is not yet activated.
            seen.append(("commit", service.list_continuations().items[0].origin_context))

        def on_phase(phase: str, _s: object) -> None:
            seen.append((phase, service.list_continuations().items[0].origin_context))

        settlement = await settle_run(binding, HISTORY, commit, on_phase=on_phase)
        assert settlement.active_claims == (claim.continuation_id,)
        assert settlement.snapshot_digest is not None
        assert seen == [
            ("closed", "pending"),
            ("finalized", "pending"),
            ("commit", "pending"),
            ("committed", "pending"),
            ("activated", "pinned"),
        ]

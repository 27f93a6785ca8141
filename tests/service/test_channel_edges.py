"""Channel edges (issue 28, point 3): only a 2xx confirms a post, a channel's answer is read
only up to a bound, and a request that can never be sent is refused at config load, or, when
it still reaches an adapter, fails as "nothing was posted" instead of an unproven post."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeSlack, FakeWebhook, Reply
from fakes.harness import make_config, running
from fakes.producer import reply_run, wait_state
from test_worker_delivery import ENV, HOOK, SLACK_TOKEN, hook_block

from afterword.cli.serve import missing_credentials
from afterword.config import ConfigError, config_from_mapping
from afterword.worker import ChunkDelivery, SlackChannel, WebhookChannel
from afterword.worker.errors import PermanentDeliveryError, UnconfirmedDeliveryError

pytestmark = pytest.mark.anyio

CHUNK = ChunkDelivery(
    delivery_key="c_x:0", conversation_id="slack:C1:T1", chunk_index=0, chunk_count=1, text="hi"
)


# -- only a 2xx confirms a post --------------------------------------------------------------
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_webhook_redirect_is_a_refusal_never_a_delivery(status: int) -> None:
    with FakeWebhook() as fake:
        fake.always(Reply(status, {"id": "moved"}, {"Location": "/moved"}))
        channel = WebhookChannel(fake.url + "/deliver")
        with pytest.raises(PermanentDeliveryError) as info:
            await channel.post(CHUNK)
        assert fake.count == 1  # never followed
    assert info.value.code == f"http_{status}"
    assert "redirect" in str(info.value)


async def test_a_slack_redirect_with_an_ok_body_is_not_a_receipt() -> None:
    with FakeSlack(SLACK_TOKEN) as fake:
        fake.always(Reply(302, {"ok": True, "ts": "1.2", "channel": "C1"}, {"Location": "/moved"}))
        with pytest.raises(PermanentDeliveryError) as info:
            await SlackChannel(fake.url, SLACK_TOKEN).post(CHUNK)
        assert fake.count == 1
    assert info.value.code == "http_302"


async def test_a_redirected_webhook_post_is_dead_lettered_and_health_says_so(tmp_path: Path) -> None:
    with FakeWebhook() as fake:
        fake.always(Reply(302, b"", {"Location": "/moved"}))
        config, env = make_config(tmp_path, hook_block(fake))
        async with running(config, env) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "x"}, reply_to=HOOK)
            rec = await wait_state(h.service, claimed.id)
        assert fake.count == 1
    assert rec.state == "dead_lettered" and rec.receipt is None and not rec.post_unproven
    assert rec.last_error is not None and rec.last_error.code == "http_302"


# -- the answer is read only up to a bound ---------------------------------------------------
class EndlessAnswer:
    """A raw HTTP server whose 200 answer announces ``size`` bytes and sends them until the
    client hangs up; ``sent`` is how many body bytes left before that."""

    def __init__(self, size: int, head: bytes = b"Content-Type: application/json\r\n") -> None:
        self.size = size
        self.head = head
        self.sent = 0
        self.requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> EndlessAnswer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
        self._thread.join(30)

    def _serve(self) -> None:
        conn, _ = self._sock.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            self.requests += 1
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n" + self.head + f"Content-Length: {self.size}\r\n\r\n".encode())
            block = b'{"id":"' + b"x" * 65_000
            try:
                while self.sent < self.size:
                    part = block[: self.size - self.sent]
                    conn.sendall(part)
                    self.sent += len(part)
                    block = b"x" * 65_536
            except OSError:
                pass  # the client hung up: exactly what a bounded reader does


ANSWER = 96 * 1024 * 1024
# What may leave the server before the client hangs up: the bound plus the kernel's socket
# buffers on both ends (a few MiB on loopback), far below the announced answer.
SENT_AT_MOST = 32 * 1024 * 1024


async def test_a_huge_webhook_answer_is_read_only_up_to_the_bound() -> None:
    with EndlessAnswer(ANSWER) as server:
        receipt = await WebhookChannel(server.url + "/deliver").post(CHUNK)
    assert server.requests == 1
    assert receipt.delivery_id == CHUNK.delivery_key  # a 2xx confirms; the body's id was not readable
    assert server.sent < SENT_AT_MOST


async def test_a_huge_slack_answer_is_not_read_and_is_an_unknown_outcome() -> None:
    with EndlessAnswer(ANSWER) as server, pytest.raises(UnconfirmedDeliveryError):  # ts unreadable
        await SlackChannel(server.url, SLACK_TOKEN).post(CHUNK)
    assert server.sent < SENT_AT_MOST


# -- a request that can never be sent --------------------------------------------------------
def _channels(channels: dict[str, Any], environ: dict[str, str] | None = None) -> None:
    config_from_mapping({"continuations": {"channels": channels}}, "/tmp", environ=environ or {})


@pytest.mark.parametrize("value", ["token\nInjected: 1", "caf\u00e9", " padded", "nul\x00"])
def test_a_webhook_header_value_that_cannot_be_sent_is_refused_at_load(value: str) -> None:
    hook = {"adapter": "webhook", "url": "http://127.0.0.1:9/x", "headers": {"X-Token": value}}
    with pytest.raises(ConfigError) as info:
        _channels({"hook": hook})
    assert info.value.path == "continuations.channels.hook.headers.X-Token"
    assert value.strip() not in str(info.value)


@pytest.mark.parametrize("name", ["Bad Name", "Idempotency-Key", "content-length", "Caf\u00e9"])
def test_a_webhook_header_name_that_cannot_be_configured_is_refused_at_load(name: str) -> None:
    hook = {"adapter": "webhook", "url": "http://127.0.0.1:9/x", "headers": {name: "v"}}
    with pytest.raises(ConfigError, match="header"):
        _channels({"hook": hook})


@pytest.mark.parametrize("token", ["xoxb-abc\n", "xoxb-\u00e9t\u00e9", "xoxb abc"])
def test_a_slack_token_that_cannot_be_sent_is_refused_at_load_without_showing_it(token: str) -> None:
    slack = {"adapter": "slack", "baseUrl": "http://127.0.0.1:9", "tokenEnv": "MY_SLACK_TOKEN"}
    with pytest.raises(ConfigError) as info:
        _channels({"slack": slack}, {"MY_SLACK_TOKEN": token})
    assert info.value.path == "continuations.channels.slack.tokenEnv"
    assert "MY_SLACK_TOKEN" in str(info.value) and token.strip() not in str(info.value)
    _channels({"slack": slack}, {"MY_SLACK_TOKEN": "xoxb-fine"})  # a sendable one loads


def test_serve_names_an_unset_slack_token_variable_at_start() -> None:
    slack = {"adapter": "slack", "baseUrl": "http://127.0.0.1:9", "tokenEnv": "MY_SLACK_TOKEN"}
    config = config_from_mapping({"continuations": {"channels": {"slack": slack}}}, "/tmp", environ={})
    notes = missing_credentials(config, {})
    assert notes == [
        "slack channel 'slack' cannot post until MY_SLACK_TOKEN holds its token; "
        "each post to it is dead-lettered (token_missing) without being sent"
    ]
    assert missing_credentials(config, {"MY_SLACK_TOKEN": "xoxb-set"}) == []


async def test_an_unsendable_request_is_nothing_posted_not_an_unknown_outcome() -> None:
    with FakeWebhook() as hook, FakeSlack(SLACK_TOKEN) as slack:
        attempts = [
            WebhookChannel(hook.url, {"X-Token": "a\r\nInjected: yes"}),  # embedded: no config check
            WebhookChannel(hook.url, {"X-Token": "caf\u00e9"}),
            SlackChannel(slack.url, "xoxb-\u00e9"),
            SlackChannel(slack.url, ""),  # the token variable is unset
        ]
        for channel in attempts:
            with pytest.raises(PermanentDeliveryError) as info:
                await channel.post(CHUNK)
            assert info.value.code in ("unsendable_request", "token_missing")
            assert "caf" not in str(info.value) and "Injected" not in str(info.value)
        assert hook.count == 0 and slack.count == 0


async def test_an_embedded_unsendable_webhook_dead_letters_without_an_unproven_post(tmp_path: Path) -> None:
    with FakeWebhook() as fake:
        config, env = make_config(tmp_path, hook_block(fake), ENV)
        broken = WebhookChannel(fake.url + "/deliver", {"X-Team": "blue\nX-Evil: 1"})
        async with running(config, env, channels={"hook": broken}) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "x"}, reply_to=HOOK)
            rec = await wait_state(h.service, claimed.id)
        assert fake.count == 0
    assert rec.state == "dead_lettered" and not rec.post_unproven
    assert rec.last_error is not None and rec.last_error.code == "unsendable_request"

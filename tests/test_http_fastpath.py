"""The ASGI fast path answers exactly as Quart does (afterword/http/fastpath.py).

One service, two listeners in this process: one serves the fast path in front of Quart, the
other Quart alone, both through the same hypercorn protocol code ``serve`` uses. Each request
is sent byte for byte to both and the two answers must match: status line, every header but
``date``, and body. Each case also says whether the fast path itself must answer it (so the
comparison really covers it) or hand it to Quart.

The whole HTTP suite also runs twice in CI, once with ``AFTERWORD_HTTP_FASTPATH=0``
(``.ci/run``); this file is the direct comparison.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from _service import DETACHED_TOKEN, payload_hash
from hypercorn.events import RawData
from test_http_protocol import Harness, serving

from afterword.continuations.rules import MAX_CLAIM_BODY, MAX_RESULT_BODY
from afterword.disk import DurabilityError, StorageFullError, UnsafeStateError
from afterword.http import listener
from afterword.http.app import create_app
from afterword.http.fastpath import DEFAULT_ON, ENV_SWITCH, FastPath, create_asgi_app, match, switch_on
from afterword.http.listener import serve_socket
from afterword.http.server import ServeError, hypercorn_config

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class Answer:
    status_line: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


def _listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


@dataclass
class Doors:
    h: Harness
    fast_port: int
    quart_port: int
    fast: FastPath

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.h.config.port}"

    async def both(self, request: bytes, *, fast: bool, parts: list[bytes] | None = None) -> Answer:
        """``request`` through both doors: the answers must be identical; returns it."""
        before = self.fast.answered
        via_fast = await exchange(self.fast_port, request, parts)
        assert (self.fast.answered - before == 1) is fast, f"fast path {'skipped' if fast else 'answered'}"
        via_quart = await exchange(self.quart_port, request, parts)
        assert via_fast == via_quart, (request[:200], via_fast, via_quart)
        return via_fast


@asynccontextmanager
async def doors(tmp_path: Path, **continuations: Any) -> AsyncIterator[Doors]:
    async with serving(tmp_path, **continuations) as h:
        fast = FastPath(h.service, create_app(h.service))  # type: ignore[arg-type]
        stop = anyio.Event()
        socks = [_listener(), _listener()]
        try:
            async with anyio.create_task_group() as tg:
                for app, sock in zip((fast, create_app(h.service)), socks, strict=True):
                    serve = partial(serve_socket, max_connections=64, shutdown_trigger=stop.wait)
                    tg.start_soon(serve, app, hypercorn_config(sock), sock)
                yield Doors(h, socks[0].getsockname()[1], socks[1].getsockname()[1], fast)
                stop.set()
        finally:
            for sock in socks:
                sock.close()


async def exchange(port: int, request: bytes, parts: list[bytes] | None = None) -> Answer:
    """Send ``request`` (then ``parts``) and read one answer; the server may answer before the
    body is complete, so a failing send is expected."""
    received = b""
    head_only = request.startswith(b"HEAD ")
    with anyio.fail_after(10):
        stream = await anyio.connect_tcp("127.0.0.1", port)
        async with stream, anyio.create_task_group() as tg:

            async def send() -> None:
                try:
                    await stream.send(request)
                    for part in parts or []:
                        await anyio.sleep(0.01)
                        await stream.send(part)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass

            tg.start_soon(send)
            while True:
                head, sep, rest = received.partition(b"\r\n\r\n")
                if sep and head.startswith(b"HTTP/1.1 1"):  # an interim answer (100 Continue)
                    received = rest
                    continue
                if sep:
                    lines = head.split(b"\r\n")
                    fields = tuple(
                        (k.strip().lower(), v.strip()) for k, v in (line.split(b":", 1) for line in lines[1:])
                    )
                    length = 0 if head_only else int(dict(fields).get(b"content-length", b"0"))
                    if len(rest) >= length:
                        tg.cancel_scope.cancel()
                        kept = tuple(f for f in fields if f[0] != b"date")
                        return Answer(lines[0], kept, rest[:length])
                try:
                    received += await stream.receive()
                except anyio.EndOfStream:
                    raise AssertionError(f"connection closed mid-answer: {received!r}") from None
    raise AssertionError("unreachable")


def raw(
    method: str,
    target: str,
    *,
    host: str | None,
    headers: list[tuple[str, str]] = (),  # type: ignore[assignment]
    body: bytes | None = None,
    chunked: bool = False,
    version: str = "HTTP/1.1",
) -> bytes:
    lines = [f"{method} {target} {version}"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{k}: {v}" for k, v in headers]
    payload = b""
    if body is not None and chunked:
        lines.append("Transfer-Encoding: chunked")
        half = len(body) // 2
        for piece in (body[:half], body[half:]):
            if piece:
                payload += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        payload += b"0\r\n\r\n"
    elif body is not None:
        lines.append(f"Content-Length: {len(body)}")
        payload = body
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin1") + payload


def jbody(doc: Any) -> bytes:
    return json.dumps(doc).encode()


JSON_CT = ("Content-Type", "application/json")


def bearer(token: str) -> tuple[str, str]:
    return ("Authorization", f"Bearer {token}")


async def test_every_request_class_answers_identically(tmp_path: Path) -> None:
    async with doors(tmp_path, limits={"bodyTimeoutMs": 300}) as d:
        h, host = d.h, d.host
        token = h.bind()[1]
        doc = {"taskKey": "task-1", "taskHash": "hash-1", "deadline": h.deadline}
        claim_ok = raw(
            "POST", "/v1/continuations/claim", host=host, headers=[bearer(token), JSON_CT], body=jbody(doc)
        )
        created = await exchange(d.quart_port, claim_ok)  # created once; from here on a replay
        claim = json.loads(created.body)
        cid, rtoken = claim["continuationId"], claim["resultToken"]
        result_path = f"/v1/continuations/{cid}/result"
        payload = {"summary": "done"}
        phash = payload_hash(payload)
        result_doc = {"idempotencyKey": "r-1", "payloadHash": phash, "payload": payload}
        await exchange(
            d.quart_port,
            raw("PUT", result_path, host=host, headers=[bearer(rtoken), JSON_CT], body=jbody(result_doc)),
        )
        det = [bearer(DETACHED_TOKEN), ("X-Mono-Agent-Service-Name", "work-control"), JSON_CT]
        det_doc = {"route": "daily-attention", **doc, "taskKey": "d-1"}

        def claim_with(headers: list[tuple[str, str]], body: bytes | None, **kw: Any) -> bytes:
            return raw("POST", "/v1/continuations/claim", host=host, headers=headers, body=body, **kw)

        big = b'{"taskKey": "' + b"x" * (MAX_CLAIM_BODY + 10) + b'"}'
        huge = b'{"idempotencyKey": "' + b"y" * (MAX_RESULT_BODY + 8192) + b'"}'
        cases: list[tuple[str, bytes, bool]] = [
            ("claim replay", claim_ok, True),
            ("claim chunked", claim_with([bearer(token), JSON_CT], jbody(doc), chunked=True), True),
            ("claim with a query", claim_ok.replace(b"/claim ", b"/claim?x=1 ", 1), True),
            ("claim wrong token", claim_with([bearer("nope"), JSON_CT], jbody(doc)), True),
            ("claim no credential", claim_with([JSON_CT], jbody(doc)), True),
            ("claim basic scheme", claim_with([("Authorization", "Basic abc"), JSON_CT], jbody(doc)), True),
            (
                "claim lower-case scheme",
                claim_with([("authorization", f"bearer {token}"), JSON_CT], jbody(doc)),
                True,
            ),
            ("claim two credentials", claim_with([bearer("nope"), bearer(token), JSON_CT], jbody(doc)), True),
            (
                "claim text/plain",
                claim_with([bearer(token), ("Content-Type", "text/plain")], jbody(doc)),
                True,
            ),
            ("claim no content type", claim_with([bearer(token)], jbody(doc)), True),
            (
                "claim json charset",
                claim_with([bearer(token), ("Content-Type", "Application/JSON; charset=utf-8")], jbody(doc)),
                True,
            ),
            ("claim bad json", claim_with([bearer(token), JSON_CT], b"{nope"), True),
            ("claim empty body", claim_with([bearer(token), JSON_CT], b""), True),
            ("claim no body", claim_with([bearer(token), JSON_CT], None), True),
            (
                "claim duplicate key",
                claim_with([bearer(token), JSON_CT], b'{"taskKey":"a","taskKey":"b"}'),
                True,
            ),
            ("claim deep nesting", claim_with([bearer(token), JSON_CT], b"[" * 100 + b"]" * 100), True),
            ("claim unknown field", claim_with([bearer(token), JSON_CT], jbody({**doc, "extra": 1})), True),
            ("claim wrong type", claim_with([bearer(token), JSON_CT], jbody({**doc, "taskKey": 5})), True),
            ("claim declared oversize", claim_with([bearer(token), JSON_CT], big), True),
            ("claim chunked oversize", claim_with([bearer(token), JSON_CT], big, chunked=True), True),
            ("claim oversize, stranger", claim_with([bearer("nope"), JSON_CT], big), True),
            (
                "claim expect",
                claim_with([bearer(token), JSON_CT, ("Expect", "100-continue")], jbody(doc)),
                False,
            ),
            ("claim HTTP/1.0", claim_with([bearer(token), JSON_CT], jbody(doc), version="HTTP/1.0"), False),
            (
                "claim wrong host",
                raw(
                    "POST",
                    "/v1/continuations/claim",
                    host="evil.example",
                    headers=[bearer(token), JSON_CT],
                    body=jbody(doc),
                ),
                False,
            ),
            (
                "claim no host",
                raw(
                    "POST",
                    "/v1/continuations/claim",
                    host=None,
                    headers=[bearer(token), JSON_CT],
                    body=jbody(doc),
                ),
                False,
            ),
            ("claim GET", raw("GET", "/v1/continuations/claim", host=host, headers=[bearer(token)]), False),
            (
                "claim PUT",
                raw("PUT", "/v1/continuations/claim", host=host, headers=[bearer(token)], body=b"{}"),
                False,
            ),
            (
                "claim double slash",
                claim_ok.replace(b"/v1/continuations/claim", b"//v1/continuations/claim", 1),
                False,
            ),
            ("claim trailing slash", claim_ok.replace(b"/claim ", b"/claim/ ", 1), False),
            ("claim escaped", claim_ok.replace(b"/claim ", b"/cl%61im ", 1), False),
            ("claim OPTIONS", raw("OPTIONS", "/v1/continuations/claim", host=host), False),
            (
                "claim head over 16 KiB",
                claim_with([bearer(token), JSON_CT, ("X-Pad", "p" * 17000)], jbody(doc)),
                False,
            ),
            (
                "detached replay",
                raw("POST", "/v1/continuations/detached/claim", host=host, headers=det, body=jbody(det_doc)),
                True,
            ),
            (
                "detached no name",
                raw(
                    "POST",
                    "/v1/continuations/detached/claim",
                    host=host,
                    headers=[det[0], JSON_CT],
                    body=jbody(det_doc),
                ),
                True,
            ),
            (
                "detached wrong name",
                raw(
                    "POST",
                    "/v1/continuations/detached/claim",
                    host=host,
                    headers=[det[0], ("X-Mono-Agent-Service-Name", "other"), JSON_CT],
                    body=jbody(det_doc),
                ),
                True,
            ),
            (
                "detached wrong token",
                raw(
                    "POST",
                    "/v1/continuations/detached/claim",
                    host=host,
                    headers=[bearer("x"), *det[1:]],
                    body=jbody(det_doc),
                ),
                True,
            ),
            (
                "result replay PUT",
                raw("PUT", result_path, host=host, headers=[bearer(rtoken), JSON_CT], body=jbody(result_doc)),
                True,
            ),
            (
                "result replay POST",
                raw(
                    "POST", result_path, host=host, headers=[bearer(rtoken), JSON_CT], body=jbody(result_doc)
                ),
                True,
            ),
            (
                "result conflicting",
                raw(
                    "PUT",
                    result_path,
                    host=host,
                    headers=[bearer(rtoken), JSON_CT],
                    body=jbody({**result_doc, "payloadHash": "0" * 64}),
                ),
                True,
            ),
            (
                "result wrong token",
                raw("PUT", result_path, host=host, headers=[bearer("nope"), JSON_CT], body=jbody(result_doc)),
                True,
            ),
            (
                "result unknown id",
                raw(
                    "PUT",
                    "/v1/continuations/c_nope/result",
                    host=host,
                    headers=[bearer(rtoken), JSON_CT],
                    body=jbody(result_doc),
                ),
                True,
            ),
            (
                "result bad json",
                raw("PUT", result_path, host=host, headers=[bearer(rtoken), JSON_CT], body=b"[1,"),
                True,
            ),
            (
                "result over Quart's cap",
                raw(
                    "PUT", result_path, host=host, headers=[bearer(rtoken), JSON_CT], body=huge, chunked=True
                ),
                True,
            ),
            ("result DELETE", raw("DELETE", result_path, host=host, headers=[bearer(rtoken)]), False),
            ("status", raw("GET", f"/v1/continuations/{cid}", host=host, headers=[bearer(rtoken)]), True),
            (
                "status with a body",
                raw("GET", f"/v1/continuations/{cid}", host=host, headers=[bearer(rtoken)], body=b"xyz"),
                True,
            ),
            (
                "status wrong token",
                raw("GET", f"/v1/continuations/{cid}", host=host, headers=[bearer("nope")]),
                True,
            ),
            ("status no credential", raw("GET", f"/v1/continuations/{cid}", host=host), True),
            (
                "status unknown id",
                raw("GET", "/v1/continuations/c_nope", host=host, headers=[bearer(rtoken)]),
                True,
            ),
            (
                "status HEAD",
                raw("HEAD", f"/v1/continuations/{cid}", host=host, headers=[bearer(rtoken)]),
                False,
            ),
            (
                "status POST",
                raw("POST", f"/v1/continuations/{cid}", host=host, headers=[bearer(rtoken)], body=b""),
                False,
            ),
            (
                "status escaped id",
                raw("GET", "/v1/continuations/c%5Fnope", host=host, headers=[bearer(rtoken)]),
                False,
            ),
            (
                "status id 'detached'",
                raw("GET", "/v1/continuations/detached", host=host, headers=[bearer(rtoken)]),
                False,
            ),
            ("livez", raw("GET", "/v1/livez", host=host), False),
            ("unknown path", raw("GET", "/v1/continuations/a/b", host=host), False),
        ]
        for name, request, fast in cases:
            answer = await d.both(request, fast=fast)
            assert answer.status_line.startswith(b"HTTP/1."), name
            if not name.startswith("status HEAD"):
                assert answer.body, name
        # The answers themselves are the documented ones (spot checks; the suite checks the rest).
        assert (await d.both(claim_ok, fast=True)).headers[:2] == (
            (b"content-type", b"application/json"),
            (b"content-length", str(len(created.body)).encode()),
        )
        status_of = {
            name: (await exchange(d.fast_port, request)).status_line for name, request, _ in cases[:22]
        }
        assert status_of["claim declared oversize"].startswith(b"HTTP/1.1 413")
        assert status_of["claim wrong token"].startswith(b"HTTP/1.1 401")
        assert status_of["claim duplicate key"].startswith(b"HTTP/1.1 400")


async def test_a_slow_body_times_out_identically(tmp_path: Path) -> None:
    async with doors(tmp_path, limits={"bodyTimeoutMs": 300}) as d:
        token = d.h.bind()[1]
        head = raw(
            "POST",
            "/v1/continuations/claim",
            host=d.host,
            headers=[bearer(token), JSON_CT, ("Content-Length", "50")],
        )
        answer = await d.both(head + b'{"task', fast=True, parts=[b"Key"])
        assert answer.status_line.startswith(b"HTTP/1.1 408")
        assert json.loads(answer.body)["error"]["code"] == "timeout"


async def test_creation_answers_the_same_shape(tmp_path: Path) -> None:
    """A first claim differs between two tasks only in its ids and tokens."""
    async with doors(tmp_path) as d:
        token = d.h.bind()[1]
        answers = []
        for port, task in ((d.fast_port, "fresh-1"), (d.quart_port, "fresh-2")):
            doc = {"taskKey": task, "taskHash": "hash-1", "deadline": d.h.deadline}
            request = raw(
                "POST",
                "/v1/continuations/claim",
                host=d.host,
                headers=[bearer(token), JSON_CT],
                body=jbody(doc),
            )
            answers.append(await exchange(port, request))
        fast, quart = answers
        assert d.fast.answered == 1
        assert fast.status_line == quart.status_line == b"HTTP/1.1 200 "
        assert [k for k, _ in fast.headers] == [k for k, _ in quart.headers]
        assert json.loads(fast.body).keys() == json.loads(quart.body).keys()


@pytest.mark.parametrize(
    "exc",
    [
        StorageFullError("/x", 28),
        DurabilityError("/x", "fsync", 5),
        UnsafeStateError("/x", "identity_changed", "path removed"),
        RuntimeError("boom"),
    ],
    ids=["storage_full", "disk_failed", "unsafe_state", "unexpected"],
)
async def test_storage_and_unexpected_errors_answer_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, exc: Exception
) -> None:
    async with doors(tmp_path) as d:
        claim = await d.h.claimed(d.h.bind()[1])

        def fail(*_: object) -> None:
            raise exc

        monkeypatch.setattr(d.h.service, "status", fail)
        request = raw(
            "GET",
            f"/v1/continuations/{claim['continuationId']}",
            host=d.host,
            headers=[bearer(claim["resultToken"])],
        )
        with caplog.at_level(logging.ERROR, logger="afterword.http"):
            answer = await d.both(request, fast=True)
        assert answer.status_line.startswith(
            b"HTTP/1.1 " + (b"500" if isinstance(exc, RuntimeError) else b"503")
        )
        lines = [r.getMessage() for r in caplog.records if r.name == "afterword.http"]
        if not isinstance(exc, StorageFullError):
            assert len(lines) == 2 and lines[0] == lines[1], lines
        if isinstance(exc, StorageFullError):
            assert (b"retry-after", b"5") in answer.headers


def _claim_scope(port: int, token: str) -> dict[str, Any]:
    headers = [
        (b"host", f"127.0.0.1:{port}".encode()),
        (b"authorization", f"Bearer {token}".encode()),
        (b"content-type", b"application/json"),
    ]
    path = "/v1/continuations/claim"
    return {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
    }


async def _drive(fast: FastPath, scope: dict[str, Any], messages: list[dict[str, Any]]) -> list[Any]:
    feed = iter(messages)
    sent: list[Any] = []

    async def receive() -> Any:
        return next(feed)

    async def send(message: Any) -> None:
        sent.append(message)

    await fast(scope, receive, send)
    return sent


async def test_a_client_gone_before_its_body_gets_no_answer(tmp_path: Path) -> None:
    async with serving(tmp_path) as h:
        fast = FastPath(h.service, create_app(h.service))  # type: ignore[arg-type]
        body = [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}]
        sent = await _drive(fast, _claim_scope(h.config.port, h.bind()[1]), body)
        assert sent == [] and fast.answered == 0
        assert h.active == 0


async def test_a_client_gone_after_its_body_still_gets_its_claim(tmp_path: Path) -> None:
    """The one documented difference from Quart (which cancels the handler): the claim is
    made and answered even though the client is gone."""
    async with serving(tmp_path) as h:
        fast = FastPath(h.service, create_app(h.service))  # type: ignore[arg-type]
        doc = {"taskKey": "gone", "taskHash": "hash-1", "deadline": h.deadline}
        body = [{"type": "http.request", "body": jbody(doc), "more_body": False}, {"type": "http.disconnect"}]
        sent = await _drive(fast, _claim_scope(h.config.port, h.bind()[1]), body)
        assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
        assert sent[0]["status"] == 200
        assert h.active == 1


def test_routes_it_answers() -> None:
    assert match("POST", "/v1/continuations/claim") == ("claim", "")
    assert match("POST", "/v1/continuations/detached/claim") == ("detached", "")
    assert match("PUT", "/v1/continuations/c_1/result") == ("result", "c_1")
    assert match("POST", "/v1/continuations/c_1/result") == ("result", "c_1")
    assert match("GET", "/v1/continuations/c_1") == ("status", "c_1")
    for method, path in [
        ("GET", "/v1/continuations/c_1/result"),
        ("DELETE", "/v1/continuations/c_1"),
        ("HEAD", "/v1/continuations/c_1"),
        ("GET", "/v1/continuations/"),
        ("PUT", "/v1/continuations//result"),
        ("PUT", "/v1/continuations/a/b/result"),
        ("GET", "/v1/continuations/claim"),
        ("GET", "/v1/operator/continuations"),
    ]:
        assert match(method, path) is None, (method, path)


def test_the_switch(tmp_path: Path) -> None:
    assert switch_on({ENV_SWITCH: "1"}) is True
    assert switch_on({ENV_SWITCH: "0"}) is False
    assert isinstance(switch_on({}), bool)
    with pytest.raises(ValueError, match=ENV_SWITCH):
        switch_on({ENV_SWITCH: "yes"})


async def test_serve_assembles_what_the_switch_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(tmp_path) as h:
        built: Callable[..., Any] = create_asgi_app
        assert isinstance(built(h.service, fastpath=True), FastPath)
        assert not isinstance(built(h.service, fastpath=False), FastPath)
        monkeypatch.setenv(ENV_SWITCH, "0")
        assert not isinstance(built(h.service), FastPath)
        monkeypatch.setenv(ENV_SWITCH, "1")
        assert isinstance(built(h.service), FastPath)


def test_ci_runs_the_http_suite_with_the_other_setting() -> None:
    """.ci/run repeats the HTTP tests with the switch opposite to the default, so both front
    doors pass them; flipping the default without flipping that run would test one door twice."""
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    settings = re.findall(
        rf"^{ENV_SWITCH}=([01]) python -m pytest .*tests/test_http_\*\.py", ci, re.MULTILINE
    )
    assert settings == ["0" if DEFAULT_ON else "1"], settings


async def test_a_bad_switch_value_stops_serve_with_a_plain_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_SWITCH, "yes")
    with pytest.raises(ServeError, match=f"{ENV_SWITCH} must be 0 or 1"):
        async with serving(tmp_path):
            pass


@pytest.mark.parametrize("fastpath", [True, False], ids=["fast", "quart"])
async def test_a_small_answer_is_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fastpath: bool
) -> None:
    """The listener writes a response's head with its body (afterword/http/listener.py): one
    ``send`` per small answer instead of two, through either door."""
    writes: list[bytes] = []
    original = listener._Connection.protocol_send

    async def recording(self: Any, event: Any) -> None:
        if isinstance(event, RawData) and event.data:
            writes.append(bytes(event.data))
        await original(self, event)

    monkeypatch.setattr(listener._Connection, "protocol_send", recording)
    async with doors(tmp_path) as d:
        claim = await d.h.claimed(d.h.bind()[1])
        request = raw(
            "GET", f"/v1/continuations/{claim['continuationId']}", host=d.host, headers=[bearer("x")]
        )
        writes.clear()
        answer = await exchange(d.fast_port if fastpath else d.quart_port, request)
        assert answer.status_line.startswith(b"HTTP/1.1 401")
        assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 401") and writes[0].endswith(answer.body)

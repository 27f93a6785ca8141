"""The follower's ``tasks/get``/``tasks/cancel`` over the real SDK 2.x client, against a real
Tasks server on loopback (tests/tasks_servers.inproc_sdk_server.py): how each answer of a
well-behaved, a forgetful and a hostile server is judged."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

from _taskfollow import require_sdk2

require_sdk2()

import anyio  # noqa: E402
import httpx2  # noqa: E402
import pytest  # noqa: E402
from tasks_servers.inproc_sdk_server import TaskBook, serving  # noqa: E402

from afterword.protocol.taskanswers import AnswerOverCap, Malformed, Polled, Unknown, Unreachable  # noqa: E402
from afterword.worker.taskfollow import MAX_ANSWER_BYTES, load_wire  # noqa: E402
from afterword.worker.taskwire import McpTaskWire, _CappedTransport  # noqa: E402

pytestmark = pytest.mark.anyio


def wire() -> McpTaskWire:
    loaded = load_wire()
    assert isinstance(loaded, McpTaskWire) and loaded.max_answer_bytes == MAX_ANSWER_BYTES
    return loaded


async def test_states_and_the_result_come_through_with_the_extension_declared() -> None:
    book = TaskBook()
    task_id = book.new(poll_interval_ms=0)
    async with serving(book) as url:
        first = await wire().get(url, {}, task_id, 10)
        book.complete(task_id, "42 rows", {"rows": 42})
        second = await wire().get(url, {}, task_id, 10)
    assert first == Polled(first.outcome) and first.outcome.status == "working"
    assert first.outcome.poll_interval_ms == 0
    assert isinstance(second, Polled) and second.outcome.status == "completed"
    assert second.outcome.result == {
        "content": [{"type": "text", "text": "42 rows"}],
        "isError": False,
        "structuredContent": {"rows": 42},
    }
    assert book.gets == [task_id, task_id] and book.declared == [True, True]


async def test_failed_input_required_and_cancelled_are_read_with_their_message() -> None:
    book = TaskBook()
    failed = book.new(status="failed", message="disk full " * 300)
    asking = book.new(status="input_required", message="which database?")
    cancelled = book.new(status="cancelled")
    async with serving(book) as url:
        answers = [await wire().get(url, {}, t, 10) for t in (failed, asking, cancelled)]
    outcomes = [a.outcome for a in answers if isinstance(a, Polled)]
    assert [o.status for o in outcomes] == ["failed", "input_required", "cancelled"]
    assert outcomes[0].message is not None and len(outcomes[0].message.encode()) <= 1024
    assert outcomes[1].message == "which database?"


async def test_a_task_the_server_forgot_is_unknown() -> None:
    book = TaskBook()
    task_id = book.new()
    async with serving(book) as url:
        book.lose_all()
        answer = await wire().get(url, {}, task_id, 10)
    assert isinstance(answer, Unknown) and task_id in answer.message


@pytest.mark.parametrize("hostile", ["wrong_id", "malformed"])
async def test_a_wrong_id_or_a_malformed_answer_is_a_failed_poll(hostile: str) -> None:
    book = TaskBook()
    task_id = book.new()
    book.hostile = hostile  # type: ignore[assignment]
    async with serving(book) as url:
        answer = await wire().get(url, {}, task_id, 10)
    assert isinstance(answer, Malformed)


@pytest.mark.parametrize("json_response", [True, False], ids=["json", "sse"])
async def test_a_huge_answer_is_cut_off_at_the_cap(json_response: bool) -> None:
    book = TaskBook(huge_bytes=8 * 1024 * 1024)
    task_id = book.new()
    book.hostile = "huge"
    async with serving(book, json_response=json_response) as url:
        answer = await wire().get(url, {}, task_id, 30)
        book.hostile = None
        after = await wire().get(url, {}, task_id, 10)  # the next poll is unaffected
    assert answer == AnswerOverCap(MAX_ANSWER_BYTES)
    assert isinstance(after, Polled)


async def test_a_failing_server_and_a_closed_port_are_unreachable() -> None:
    book = TaskBook()
    task_id = book.new()
    book.hostile = "error_500"
    async with serving(book) as url:
        failing = await wire().get(url, {}, task_id, 10)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"  # bound, never listening
        refused = await wire().get(closed_url, {}, task_id, 10)
    assert isinstance(failing, Unreachable) and isinstance(refused, Unreachable)


async def test_a_slow_answer_times_out_as_unreachable() -> None:
    book = TaskBook()
    task_id = book.new()
    book.hostile = "slow"
    async with serving(book) as url:
        with anyio.fail_after(20):
            answer = await wire().get(url, {}, task_id, 0.5)
        book.release_slow.set()
    assert isinstance(answer, Unreachable) and "0.5" in answer.detail


async def test_cancel_reaches_the_server_and_a_refusal_says_why() -> None:
    book = TaskBook()
    task_id = book.new()
    async with serving(book) as url:
        accepted = await wire().cancel(url, {}, task_id, 10)
        book.lose_all()
        refused = await wire().cancel(url, {}, task_id, 10)
    assert accepted is None and book.cancels == [task_id, task_id]
    assert refused is not None and "not found" in refused


@pytest.mark.parametrize(
    ("headers", "too_large"),
    [({"content-length": str(MAX_ANSWER_BYTES + 1)}, True), ({"content-encoding": "gzip"}, False)],
    ids=["declared-too-long", "compressed"],
)
async def test_an_answer_is_refused_unread_when_its_size_is_not_bounded(
    headers: dict[str, str], too_large: bool
) -> None:
    """A declared length over the limit, or a compressed body (whose decoded size the limit
    cannot bound), is refused before a byte of it is read."""
    read: list[int] = []

    class Body(httpx2.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            read.append(1)
            yield b"{}"

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers=headers, stream=Body())

    transport = _CappedTransport(MAX_ANSWER_BYTES, wire().tls)
    transport._inner = httpx2.MockTransport(answer)  # type: ignore[assignment]
    with pytest.raises(httpx2.StreamError):
        await transport.handle_async_request(httpx2.Request("POST", "http://127.0.0.1:9/mcp"))
    assert transport.exceeded is too_large and read == []

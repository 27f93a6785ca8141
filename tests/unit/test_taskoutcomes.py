"""The MCP Tasks bridge's outcome table, row by row, as pure functions (no service, no clock):
afterword/continuations/taskoutcomes.py and taskcancel.py, and the wire rules of
afterword/protocol/tasks.py."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from _claims import make_claim
from hypothesis import given
from hypothesis import strategies as st

from afterword.continuations import lifecycle
from afterword.continuations import taskoutcomes as table
from afterword.continuations.errors import InvalidRequest
from afterword.continuations.model import (
    Continuation,
    ResultRecord,
    TaskBacking,
    decode_continuation,
    encode,
)
from afterword.continuations.taskcancel import owes_cancel, request_cancel
from afterword.continuations.verdicts import cancel
from afterword.protocol.tasks import (
    TaskHandle,
    TaskOutcome,
    check_handle,
    check_outcome,
    decode_handle,
    decode_outcome,
)
from afterword.worker.synthesizers import SynthesisRequest, instructions, render_template

NOW = 1_900_000_000_000
DEADLINE = NOW + 3_600_000
LIMIT = 256 * 1024


def task(**changes: Any) -> TaskBacking:
    return TaskBacking(**{"task_id": "task-7", "follow": "service", "status": "working", **changes})


def record(state: str = "claimed", **changes: Any) -> Continuation:
    fields: dict[str, Any] = dict(
        claim=make_claim(created_at_ms=NOW - 1000, deadline_ms=DEADLINE),
        claim_mac="m",
        state=state,
        origin_context="pinned",
        updated_at_ms=NOW - 1000,
        task=task(),
    )
    fields.update(changes)
    return Continuation(**fields)


def result_of(payload: bytes) -> ResultRecord:
    return ResultRecord(
        idempotency_key="task:task-7", payload_hash="a" * 64, payload=payload, received_at_ms=NOW
    )


def call_result(
    structured: Any = None, texts: tuple[str, ...] = (), is_error: bool | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"content": [{"type": "text", "text": t} for t in texts]}
    if structured is not None:
        out["structuredContent"] = structured
    if is_error is not None:
        out["isError"] = is_error
    return out


# -- row: working ----------------------------------------------------------------------------
def test_working_changes_nothing_durable() -> None:
    d = table.decide(record(), TaskOutcome(status="working", poll_interval_ms=5), NOW)
    assert d.kind == "working"
    assert table.apply(record(), d, NOW) is None


@pytest.mark.parametrize(
    ("hint", "failures", "delay"),
    [(None, 0, 1000), (0, 0, 250), (10**9, 0, 60_000), (500, 0, 500), (500, 2, 2000), (500, 40, 60_000)],
)
def test_poll_delay_is_clamped_with_bounded_backoff(hint: int | None, failures: int, delay: int) -> None:
    assert table.poll_delay_ms(hint, failures) == delay


@given(
    st.one_of(st.none(), st.integers(min_value=0, max_value=10**12)),
    st.integers(min_value=0, max_value=10**6),
)
def test_poll_delay_always_within_bounds(hint: int | None, failures: int) -> None:
    assert table.MIN_POLL_MS <= table.poll_delay_ms(hint, failures) <= table.MAX_POLL_MS


# -- row: completed --------------------------------------------------------------------------
def test_completed_structured_content_is_the_payload() -> None:
    d = table.decide(
        record(), TaskOutcome(status="completed", result=call_result({"n": 1}, ("ignored",))), NOW
    )
    assert (d.kind, d.payload, d.failed) == ("accept", {"n": 1}, False)
    new = table.apply(record(), d, NOW, result_of(b'{"n":1}'))
    assert new is not None and new.state == "result_received" and new.result is not None
    assert new.result.idempotency_key == "task:task-7" == table.idempotency_key("task-7")
    assert new.task is not None and (new.task.status, new.task.reported_at_ms) == ("completed", NOW)
    assert new.last_error is None


@pytest.mark.parametrize(
    ("result", "payload"),
    [
        (call_result(None, ("a", "b")), {"text": "a\nb"}),
        (call_result([1, 2], ("list is not an object",)), {"text": "list is not an object"}),
        ({"content": [{"type": "image", "data": "x"}, {"type": "text", "text": "t"}, "junk"]}, {"text": "t"}),
        # No text at all: never an empty answer. Other blocks are named, nothing is "finished".
        ({"content": "not a list"}, {}),
        (call_result(None, ()), {}),
        (
            {
                "content": [
                    {"type": "image", "data": "x", "mimeType": "image/png"},
                    {"type": "resource_link", "uri": "u"},
                ]
            },
            {"text": "The task finished with content that cannot be shown here (image, resource link)."},
        ),
        (
            {"content": [{"type": "text", "text": ""}, {"type": "audio", "data": "x"}]},
            {"text": "The task finished with content that cannot be shown here (audio)."},
        ),
        (call_result({"x": 1}, is_error=False), {"x": 1}),
    ],
)
def test_completed_text_payload(result: dict[str, Any], payload: dict[str, Any]) -> None:
    assert table.decide(record(), TaskOutcome(status="completed", result=result), NOW).payload == payload


def test_a_result_without_text_is_never_an_empty_answer() -> None:
    empty = render_template(table.task_payload({"content": []}))
    assert empty.endswith("the task finished.")
    image = render_template(table.task_payload({"content": [{"type": "image", "data": "x"}]}))
    assert "cannot be shown here (image)" in image


# -- row: failed / isError -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        (TaskOutcome(status="failed", message="disk full"), "disk full"),
        (TaskOutcome(status="failed"), "the task failed"),
        (TaskOutcome(status="completed", result=call_result({"a": 1}, ("boom",), is_error=True)), "boom"),
        (TaskOutcome(status="failed", result=call_result(None, ("tool said no",))), "tool said no"),
        # The tool's error text says what went wrong; the task's status message does not.
        (
            TaskOutcome(
                status="completed",
                result=call_result(None, ("disk full",), is_error=True),
                message="Task completed",
            ),
            "disk full",
        ),
        (
            TaskOutcome(status="completed", result=call_result(None, (), is_error=True), message="quota"),
            "quota",
        ),
    ],
)
def test_failure_is_a_result_that_says_so(outcome: TaskOutcome, message: str) -> None:
    d = table.decide(record(), outcome, NOW)
    assert (d.kind, d.failed, d.payload) == ("accept", True, {"taskFailed": True, "message": message})
    new = table.apply(record(), d, NOW, result_of(b"{}"))
    assert new is not None and new.state == "result_received"
    assert new.last_error is not None and new.last_error.code == "task_failed"


def test_failure_message_is_bounded_in_bytes() -> None:
    d = table.decide(record(), TaskOutcome(status="failed", result=call_result(None, ("é" * 5000,))), NOW)
    assert d.payload is not None and len(d.payload["message"].encode()) <= table.MAX_FAILURE_MESSAGE


# -- rows that end the record ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("outcome", "state", "code", "owed"),
    [
        (TaskOutcome(status="cancelled"), "cancelled", "task_cancelled", False),
        (TaskOutcome(status="input_required"), "dead_lettered", "task_input_required", True),
        (TaskOutcome(status="lost", message="gone"), "dead_lettered", "task_lost", False),
        (TaskOutcome(status="protocol_error"), "dead_lettered", "task_protocol_error", False),
        (
            TaskOutcome(status="too_large", message="over 1 MiB"),
            "dead_lettered",
            "task_result_too_large",
            False,
        ),
    ],
)
def test_ending_rows(outcome: TaskOutcome, state: str, code: str, owed: bool) -> None:
    d = table.decide(record(), outcome, NOW)
    new = table.apply(record(), d, NOW)
    assert new is not None and new.state == state and new.terminal_at_ms == NOW
    assert new.last_error is not None and new.last_error.code == code
    assert new.task is not None and new.task.status == outcome.status
    # The intent to cancel is in the same record version as the dead letter: durable first.
    assert owes_cancel(new.task) is owed


def test_lost_keeps_the_reporters_message() -> None:
    new = table.apply(
        record(), table.decide(record(), TaskOutcome(status="lost", message="unknown id"), NOW), NOW
    )
    assert new is not None and new.last_error is not None and new.last_error.message == "unknown id"


def test_result_over_the_limit_is_dead_lettered() -> None:
    d = table.decide(record(), TaskOutcome(status="completed", result=call_result({"x": 1})), NOW)
    assert table.sized(d, LIMIT, LIMIT) is d
    big = table.sized(d, LIMIT + 1, LIMIT)
    assert (big.kind, big.code) == ("dead_letter", "task_result_too_large")
    new = table.apply(record(), big, NOW)
    assert new is not None and new.state == "dead_lettered" and new.result is None
    ending = table.decide(record(), TaskOutcome(status="cancelled"), NOW)
    assert table.sized(ending, LIMIT * 10, LIMIT) is ending  # only a result is sized


# -- late outcomes -----------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["result_received", "delivered", "cancelled", "dead_lettered", "expired"])
@pytest.mark.parametrize("status", ["working", "completed", "failed", "cancelled", "input_required", "lost"])
def test_an_outcome_after_the_wait_changes_nothing(state: str, status: str) -> None:
    outcome = TaskOutcome(status=status, result=call_result({"a": 1}))  # type: ignore[arg-type]
    d = table.decide(record(state), outcome, NOW)
    assert d.kind == "ignore" and table.apply(record(state), d, NOW) is None


def test_an_outcome_past_the_deadline_is_left_to_expiry() -> None:
    late = table.decide(record(), TaskOutcome(status="completed", result=call_result({"a": 1})), DEADLINE + 1)
    assert late.kind == "ignore"
    assert table.decide(record(), TaskOutcome(status="cancelled"), DEADLINE).kind == "cancel"


def test_a_record_without_a_task_is_not_decided() -> None:
    assert table.decide(record(task=None), TaskOutcome(status="cancelled"), NOW).kind == "ignore"


# -- the host's lease ----------------------------------------------------------------------------
def test_host_gone_only_for_a_host_followed_task_still_waiting() -> None:
    hosted = record(task=task(follow="host"))
    assert table.host_gone(hosted, NOW + 1, NOW) is None  # the lease holds
    gone = table.host_gone(hosted, NOW, NOW)
    assert gone is not None and gone.state == "dead_lettered"
    assert gone.last_error is not None and gone.last_error.code == "task_host_gone"
    # A host that was only slow, not gone, is told to stop the work nobody will answer.
    assert gone.task is not None and owes_cancel(gone.task)
    assert table.host_gone(record(), NOW, NOW) is None  # the service follows it
    assert table.host_gone(record("result_received", task=task(follow="host")), NOW, NOW) is None


# -- cancel --------------------------------------------------------------------------------------
def test_operator_cancel_and_expiry_owe_tasks_cancel() -> None:
    cancelled = cancel(record(), NOW)
    assert cancelled is not None and owes_cancel(cancelled.task)
    expired = lifecycle.expire(record(), DEADLINE + 1)
    assert owes_cancel(expired.task)
    # A task already over owes nothing; a record without a task is untouched.
    done = record(task=task(status="completed"))
    assert request_cancel(done) is done
    plain = record(task=None)
    assert request_cancel(plain) is plain
    no_task = cancel(plain, NOW)
    assert no_task is not None and no_task.task is None


def test_cancel_sent_is_recorded_once_and_failures_are_kept() -> None:
    owed = request_cancel(record("cancelled"))
    sent = table.record_cancel_sent(owed, False, "x" * 2000, NOW)
    assert sent is not None and sent.state == "cancelled" and sent.task is not None
    assert (sent.task.cancel_ok, sent.task.cancel_sent_at_ms) == (False, NOW)
    assert sent.task.cancel_detail is not None and len(sent.task.cancel_detail) <= 512
    assert not owes_cancel(sent.task) and sent.task.cancel_requested  # never undone
    assert table.record_cancel_sent(sent, True, None, NOW) is None
    assert table.record_cancel_sent(record(), True, None, NOW) is None  # nothing owed


# -- the record and the wire ---------------------------------------------------------------------
def test_records_without_a_task_still_decode() -> None:
    plain = record(task=None)
    raw = msgspec.msgpack.decode(encode(plain))
    assert "task" in raw
    del raw["task"]  # as a record written before the bridge existed
    assert decode_continuation(msgspec.msgpack.encode(raw)) == plain
    backed = record()
    assert decode_continuation(encode(backed)).task == backed.task


@pytest.mark.parametrize(
    "body",
    [
        b'{"taskId":"","status":"working"}',
        b'{"taskId":"a\\u0007b","status":"working"}',
        b'{"taskId":"a\\u0085b","status":"working"}',
        b'{"taskId":"' + b"x" * 257 + b'","status":"working"}',
        b'{"taskId":"t","status":"done"}',
        b'{"taskId":"t","status":"working","pollIntervalMs":-1}',
        b'{"taskId":"t","status":"working","ttlMs":1.5}',
        b'{"taskId":"t","status":"working","resultType":"task"}',
        b'{"taskId":"t"}',
        b"[1]",
        b"{",
    ],
)
def test_hostile_handles_are_refused(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        decode_handle(body)


def test_handle_hints_are_taken_as_given() -> None:
    h = decode_handle(
        b'{"taskId":"t \xc3\xa9","status":"input_required","pollIntervalMs":0,"ttlMs":1000000000}'
    )
    assert h == TaskHandle(task_id="t é", status="input_required", poll_interval_ms=0, ttl_ms=10**9)
    check_handle(TaskHandle(task_id="x" * 256, status="working"))


@pytest.mark.parametrize(
    "body",
    [
        b'{"status":"failed","message":"' + b"m" * 1025 + b'"}',
        b'{"status":"failed","message":"' + "é".encode() * 513 + b'"}',
        b'{"status":"completed"}',
        b'{"status":"completed","result":[1]}',
        b'{"status":"working","extra":1}',
        b'{"status":"exploded"}',
    ],
)
def test_hostile_outcomes_are_refused(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        decode_outcome(body)


def test_outcomes_built_in_process_are_checked_too() -> None:
    with pytest.raises(InvalidRequest):
        check_outcome(TaskOutcome(status="failed", message="é" * 600))  # 1200 bytes
    with pytest.raises(InvalidRequest):
        check_handle(TaskHandle(task_id="a\nb", status="working"))
    check_outcome(TaskOutcome(status="failed", message="m" * 1024))


# -- the answer a failed task gets -------------------------------------------------------------
def test_a_failed_task_is_answered_as_a_failure() -> None:
    payload = table.failure_payload(TaskOutcome(status="failed", message="disk full"))
    assert render_template(payload) == "Update on your earlier request: the background task failed: disk full"
    assert render_template({"taskFailed": True}).endswith("the background task failed: no reason was given")
    assert "failed" not in render_template({"taskFailed": False, "summary": "ok"})
    request = SynthesisRequest(
        continuation_id="c",
        mode="reply",
        conversation_id="x",
        origin_context="pinned",
        messages=(),
        payload=payload,
    )
    assert "FAILED" in instructions(request)
    assert "FAILED" not in instructions(msgspec.structs.replace(request, payload={"summary": "ok"}))

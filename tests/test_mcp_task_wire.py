"""The host's reading of a ``tasks/get`` answer (afterword/clients/mcp_task_wire.py): rules
that keep the embedded and the host-API paths to one outcome for the same answer."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from afterword.clients.mcp_task_wire import MalformedTask, read_outcome


def answer(structured: Any) -> dict[str, Any]:
    result = {"content": [{"type": "text", "text": "done"}], "structuredContent": structured, "isError": False}
    return {"taskId": "t-1", "status": "completed", "result": result}


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_a_result_with_a_number_json_cannot_carry_is_malformed(number: float) -> None:
    # The MCP SDK reads NaN from a server; the host API's client would have sent it as null
    # while the embedded service refuses it: neither silently, both as a protocol error.
    assert msgspec.json.encode({"v": number}) == b'{"v":null}'
    with pytest.raises(MalformedTask, match="NaN or Infinity") as caught:
        read_outcome(answer({"rows": [1.5, {"v": number}]}), "t-1")
    assert str(number) not in str(caught.value).replace("NaN or Infinity", "")


def test_ordinary_numbers_pass() -> None:
    outcome = read_outcome(answer({"rows": [1.5, -2, 10**30, 1e300]}), "t-1")
    assert outcome.status == "completed" and outcome.result is not None

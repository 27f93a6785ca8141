"""Legacy fixtures (v1 monolith, v2 records) and a model of the 0.10 runtime's reader."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from _service import payload_hash

T0 = "2026-11-01T10:00:00.000Z"
T1 = "2026-11-01T10:05:00.000Z"
FUTURE = "2030-01-02T03:04:05.000Z"


class GuardRefused(Exception):
    """The 0.10 runtime refuses a records-v2/ that carries the v3 rollback guard."""


def record(rid: str, state: str, **over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": rid,
        "state": state,
        "serverName": "work-control",
        "kind": "detached",
        "mode": "notify_if_actionable",
        "conversationId": "slack:C_DAILY:T_1",
        "replyTo": "slack:C_DAILY:T_1",
        "route": "daily-attention",
        "taskKey": f"task-{rid}",
        "taskHash": f"hash-{rid}",
        "deadline": FUTURE,
        "createdAt": T0,
        "updatedAt": T1,
    }
    if state not in ("claimed",):
        payload = {"summary": f"result of {rid}"}
        rec["result"] = {
            "idempotencyKey": f"key-{rid}",
            "payloadHash": payload_hash(payload),
            "payload": payload,
        }
    if state == "delivered":
        rec["text"] = f"answer for {rid}"
        rec["receipt"] = {"deliveredAt": T1, "channelId": "C_DAILY", "deliveryIds": ["1700000000.1"]}
    if state == "dead_lettered":
        rec["lastError"] = "permanent refusal"
    rec.update(over)
    return rec


def interactive(rid: str, state: str = "result_received") -> dict[str, Any]:
    return record(
        rid,
        state,
        kind="interactive",
        mode="reply",
        conversationId="slack:C1:T1#2026-10-31",
        replyTo="slack:C1:T1",
        route=None,
        historyBoundary=12,
    )


def fixture_records() -> list[dict[str, Any]]:
    return [
        record("r-pending", "claimed"),
        record("r-received", "result_received"),
        record("r-delivered", "delivered"),
        record("r-dead", "dead_lettered"),
        interactive("r-interactive"),
    ]


def write_v1(state: Path, records: list[dict[str, Any]]) -> Path:
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = state / "continuations.json"
    path.write_text(json.dumps({"format": "monolith-v1", "records": records}))
    os.chmod(path, 0o600)
    return path


class V010Runtime:
    """What the 0.10 line does with records-v2/: its live mutable store, unless guarded."""

    def __init__(self, state: Path) -> None:
        self.dir = state / "records-v2"
        if (self.dir / "ROLLBACK-GUARD").exists():
            raise GuardRefused(str(self.dir))
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    def write(self, rec: dict[str, Any]) -> None:
        path = self.dir / f"{rec['id']}.json"
        path.write_text(json.dumps({**rec, "format": "records-v2"}))
        os.chmod(path, 0o600)

    def ids(self) -> set[str]:
        return {p.stem for p in self.dir.glob("*.json")}


def write_v2(state: Path, records: list[dict[str, Any]]) -> None:
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    runtime = V010Runtime(state)
    for rec in records:
        runtime.write(rec)

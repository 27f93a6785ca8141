"""A Claim factory for unit tests of the pure core."""

from __future__ import annotations

from afterword.continuations.model import Claim


def make_claim(*, created_at_ms: int, deadline_ms: int, **changes: object) -> Claim:
    fields: dict[str, object] = dict(
        id="c_test",
        kind="interactive",
        server_name="work-control",
        run_id="run-1",
        conversation_id="slack:C1:T1#2030-01-01",
        reply_to="slack:C1:T1",
        route=None,
        mode="reply",
        task_key="task",
        task_hash="hash",
        deadline_ms=deadline_ms,
        fingerprint="sha256:f",
        created_at_ms=created_at_ms,
    )
    fields.update(changes)
    return Claim(**fields)  # type: ignore[arg-type]

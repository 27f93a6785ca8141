"""Session control of the task journal: whether an automatic turn may run (invariant 6 of
:mod:`.core`), and the facts that decide it (user input, interruption, goal, model failures).
"""

from __future__ import annotations

import msgspec

from .records import GoalState, SessionControl

_replace = msgspec.structs.replace


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    run: bool
    reason: str


def continuation_decision(
    control: SessionControl, *, busy: bool, pending: int, tool_call_open: bool = False
) -> Decision:
    """Whether an automatic turn may run now (invariant 6). Checked in this order.

    ``tool_call_open``: the conversation ends in a tool call still waiting for its result; a
    model step now would see a call without its result, so the host's tool loop goes first.
    """
    if busy:
        return Decision(run=False, reason="busy")
    if tool_call_open:
        return Decision(run=False, reason="tool_call_open")
    if control.interrupted:
        return Decision(run=False, reason="interrupted")
    if control.goal in ("paused", "blocked"):
        return Decision(run=False, reason=f"goal_{control.goal}")
    if control.awaiting_user:
        return Decision(run=False, reason="retries_exhausted")
    if pending <= 0:
        return Decision(run=False, reason="nothing_pending")
    return Decision(run=True, reason="pending_tasks")


def user_input(control: SessionControl, *, now: float) -> SessionControl:
    """New user input lifts interruption and the retry stop (a goal stays as it was set)."""
    return _replace(control, interrupted=False, awaiting_user=False, model_failures=0, updated_at=now)


def turn_began(control: SessionControl, *, now: float) -> SessionControl:
    """A turn that runs the tool loop started: a crash before :func:`turn_ended` leaves calls
    only this turn would have answered, and recovery closes them."""
    return _replace(control, turn_open=True, updated_at=now)


def turn_ended(control: SessionControl, *, now: float) -> SessionControl:
    return control if not control.turn_open else _replace(control, turn_open=False, updated_at=now)


def interrupted(control: SessionControl, *, now: float) -> SessionControl:
    return _replace(control, interrupted=True, updated_at=now)


def goal_set(control: SessionControl, goal: GoalState, *, now: float) -> SessionControl:
    return _replace(control, goal=goal, updated_at=now)


def turn_finished(
    control: SessionControl, *, error: str | None, max_model_failures: int, now: float
) -> SessionControl:
    """Count consecutive model failures; at the limit, stop until new user input."""
    if error is None:
        return _replace(control, model_failures=0, last_error=None, updated_at=now)
    failures = control.model_failures + 1
    return _replace(
        control,
        model_failures=failures,
        awaiting_user=control.awaiting_user or failures >= max_model_failures,
        last_error=error,
        updated_at=now,
    )

"""What every lifecycle function shares: its guard, its target state and how a record ends.

The guards (``ALLOWED``) and target states are read off :data:`.transitions.TRANSITIONS`;
``unproven`` and ``may_post`` state invariant 5 of :mod:`.lifecycle` (a post whose outcome was
never proven is not repeated without the operator's opt-in).
"""

from __future__ import annotations

import msgspec

from .errors import Conflict, InvalidTransition
from .model import STATES, Continuation, State
from .transitions import TRANSITIONS, UNPROVEN_REFUSAL, Event, Verb, flags, operator_refusal

# The guards: lifecycle event -> the states it is allowed in, read off the transition table.
# Two lifecycle events stand for several table events, one per outcome.
_TABLE_EVENTS: dict[str, tuple[Event, ...]] = {
    "submit_result": ("submit_result",),
    "expire": ("expire",),
    "begin_synthesis": ("begin_synthesis",),
    "finish_synthesis": ("finish_synthesis",),
    "synthesize_locally": ("synthesize_locally",),
    "prepare_without_model": ("prepare_fallback", "prepare_silent"),
    "fail_synthesis": ("fail_synthesis",),
    "begin_delivery": ("begin_delivery",),
    "record_chunk": ("record_chunk",),
    "delivered": ("delivered",),
    "delivery_failed": ("delivery_failed", "delivery_refused"),
    "delivery_unknown": ("delivery_unknown",),
    "dead_letter": ("dead_letter",),
}
ALLOWED: dict[str, frozenset[str]] = {
    event: frozenset(s for s in STATES if any(e in TRANSITIONS[s] for e in table))
    for event, table in _TABLE_EVENTS.items()
}


def require(rec: Continuation, event: str) -> None:
    if rec.state not in ALLOWED[event]:
        raise InvalidTransition(rec.state, event)


def move(rec: Continuation, event: Event) -> State:
    """The state ``event`` leads to from ``rec``'s state, per the table."""
    state = TRANSITIONS[rec.state].get(event)
    if state is None:
        raise InvalidTransition(rec.state, event)
    return state


def terminate(rec: Continuation, state: State, now_ms: int, **changes: object) -> Continuation:
    # A new outcome needs its own acknowledgement: an older one never hides it.
    changes.setdefault("acknowledged_at_ms", None)
    return msgspec.structs.replace(
        rec,
        state=state,
        updated_at_ms=now_ms,
        terminal_at_ms=now_ms,
        delivery_in_flight=False,
        repost_allowed=False,
        **changes,
    )


__all__ = [
    "ALLOWED",
    "UNPROVEN_REFUSAL",
    "may_post",
    "move",
    "require",
    "require_verb",
    "retry_refusal",
    "terminate",
    "unproven",
]


def require_verb(rec: Continuation, verb: Verb) -> None:
    """Refuse an operator verb that a flag of ``rec`` forbids (transitions.OPERATOR_REFUSALS).

    Each verb calls it before anything else: a post in flight is the reason an operator most
    needs to hear, whatever else (the state row) would also refuse the verb."""
    why = operator_refusal(rec, verb)
    if why is not None:
        raise Conflict(why)


def retry_refusal(rec: Continuation, *, allow_unknown: bool) -> Conflict | None:
    """Why an operator retry of ``rec`` is refused (the error to raise), or None when it is
    accepted. Health reads it to offer ``retry`` only where it would be accepted."""
    why = operator_refusal(rec, "retry_allow_unknown" if allow_unknown else "retry")
    if why is not None:
        return Conflict(why)
    if "retry_delivery" not in TRANSITIONS[rec.state]:
        return InvalidTransition(rec.state, "retry")
    if (
        rec.state == "dead_lettered"
        and rec.last_error is not None
        and rec.last_error.code == "binding_invalid"
    ):
        return Conflict("claim metadata failed its integrity check; it cannot be retried")
    if rec.text is None and rec.completion_kind is None and rec.result is None:
        return InvalidTransition(rec.state, "retry")
    return None


def unproven(rec: Continuation) -> bool:
    """Some post of this answer began and was never proven (sticky; see invariant 5)."""
    return "unproven" in flags(rec)


def may_post(rec: Continuation) -> bool:
    """Whether a channel may be called for this record now (invariant 5)."""
    return not unproven(rec) or rec.repost_allowed

"""What every lifecycle function shares: its guard, its target state and how a record ends.

The guards (``ALLOWED``) and target states are read off :data:`.transitions.TRANSITIONS`;
``unproven`` and ``may_post`` state invariant 5 of :mod:`.lifecycle` (a post whose outcome was
never proven is not repeated without the operator's opt-in).
"""

from __future__ import annotations

import msgspec

from .errors import InvalidTransition
from .model import STATES, Continuation, State
from .transitions import TRANSITIONS, Event

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


UNPROVEN_REFUSAL = (
    "an earlier post of this answer has an unknown outcome, so posting again could duplicate it: "
    "resolve it, or after checking the channel retry with --allow-unknown "
    "(HTTP allowUnknown: true, embedded allow_unknown=True)"
)


def unproven(rec: Continuation) -> bool:
    """Some post of this answer began and was never proven (sticky; see invariant 5)."""
    return rec.post_unproven or rec.state == "delivery_unknown"


def may_post(rec: Continuation) -> bool:
    """Whether a channel may be called for this record now (invariant 5)."""
    return not unproven(rec) or rec.repost_allowed

"""The whole continuation lifecycle as one table: ``TRANSITIONS[state][event] -> state``.

Like h11's connection state machine: an event missing from a state's row is refused
(``InvalidTransition``). :mod:`.lifecycle` takes both its guards (``ALLOWED``) and the target
states of its functions from here, and adds the field changes. An event whose outcome depends
on the record (a retryable failure below the attempt cap vs. one that dead-letters) is split
into one event per outcome, so every entry has exactly one target.

Invariants the table encodes (numbered as in :mod:`.lifecycle`):

1. Only ``claimed`` accepts a result.
2. ``synthesizing`` is entered only from ``result_received``; a restart during it
   dead-letters (``recover_synthesis``), never re-enters it. A local synthesizer (in-process,
   deterministic, nothing leaves the process) skips it: ``synthesize_locally`` commits the
   attempt and the answer at once, because a crash before that commit leaves
   ``result_received`` and running it again is indistinguishable from the lost run.
3. Delivery events exist only in ``ready_to_deliver`` and ``delivery_retry``.
4. Terminal states leave only through operator events (``retry_*``, ``resolve_*``).

This module imports only the record model, so the lifecycle can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from .model import State

Event = Literal[
    # producer / service
    "submit_result",
    "expire",
    # worker: synthesis
    "begin_synthesis",
    "finish_synthesis",
    "prepare_fallback",
    "prepare_silent",
    "fail_synthesis",
    "synthesize_locally",
    # worker: delivery
    "begin_delivery",
    "record_chunk",
    "delivered",
    "delivery_failed",
    "delivery_refused",
    "delivery_unknown",
    "hold_unproven",
    "reconcile_found",
    "reconcile_resume",
    "dead_letter",
    "park",
    "park_unknown",
    # restart
    "recover_synthesis",
    "recover_delivery",
    # operator
    "cancel",
    "retry_delivery",
    "retry_synthesis",
    "resolve_delivered",
    "resolve_not_delivered",
    "resolve_dead_lettered",
]

_DELIVERING: dict[Event, State] = {
    "begin_delivery": "ready_to_deliver",  # replaced per row below: the state is kept
    "record_chunk": "ready_to_deliver",
    "delivered": "delivered",
    "delivery_failed": "delivery_retry",
    "delivery_refused": "dead_lettered",
    "delivery_unknown": "delivery_unknown",
    "hold_unproven": "delivery_retry",
    "reconcile_found": "delivered",
    "reconcile_resume": "delivery_retry",
    "recover_delivery": "delivery_unknown",
    "park_unknown": "delivery_unknown",
}
_ACTIVE_END: dict[Event, State] = {"dead_letter": "dead_lettered", "park": "dead_lettered", "cancel": "cancelled"}
_OPERATOR_RETRY: dict[Event, State] = {
    "retry_delivery": "delivery_retry",
    "retry_synthesis": "result_received",
}


def _delivering(state: State) -> dict[Event, State]:
    row = dict(_DELIVERING)
    row["begin_delivery"] = row["record_chunk"] = state  # in-flight bookkeeping, no move
    return row


TRANSITIONS: Mapping[State, Mapping[Event, State]] = {
    "claimed": {"submit_result": "result_received", "expire": "expired", **_ACTIVE_END},
    "result_received": {
        "begin_synthesis": "synthesizing",
        "synthesize_locally": "ready_to_deliver",
        "fail_synthesis": "dead_lettered",  # a local synthesizer failed (no synthesizing commit)
        "prepare_fallback": "ready_to_deliver",
        "prepare_silent": "delivered",
        **_ACTIVE_END,
    },
    "synthesizing": {
        "finish_synthesis": "ready_to_deliver",
        "prepare_fallback": "ready_to_deliver",
        "prepare_silent": "delivered",
        "fail_synthesis": "dead_lettered",
        "recover_synthesis": "dead_lettered",
        **_ACTIVE_END,
    },
    "ready_to_deliver": {**_delivering("ready_to_deliver"), **_ACTIVE_END},
    "delivery_retry": {**_delivering("delivery_retry"), **_ACTIVE_END, **_OPERATOR_RETRY},
    "delivered": {},
    "delivery_unknown": {
        **_OPERATOR_RETRY,
        "resolve_delivered": "delivered",
        "resolve_not_delivered": "delivery_retry",
        "resolve_dead_lettered": "dead_lettered",
    },
    "expired": {},
    "cancelled": {},
    "dead_lettered": dict(_OPERATOR_RETRY),
}


def target(state: State, event: Event) -> State | None:
    """Where ``event`` takes a record in ``state``; None when the event is refused there."""
    return TRANSITIONS[state].get(event)

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
5. The table's second half: what a record carries besides its state (:data:`Flag`, read by
   :func:`flags`) decides whether an operator verb may act at all (:data:`OPERATOR_REFUSALS`)
   and what ``next_action`` does. While a post is in flight nothing an operator does may hide
   its outcome or clear the mark that makes a crash an unknown outcome, so every verb waits;
   a chunk receipt is proof that part of the answer reached the channel, so no verb may drop
   it or post that part again.

This module imports only the record model, so the lifecycle can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from .model import Continuation, State

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
_ACTIVE_END: dict[Event, State] = {
    "dead_letter": "dead_lettered",
    "park": "dead_lettered",
    "cancel": "cancelled",
}
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


# -- the flags: what besides the state decides a verb or the next action ----------------------
Flag = Literal["in_flight", "chunk_receipts", "unproven", "held", "deferred"]
FLAGS: tuple[Flag, ...] = ("in_flight", "chunk_receipts", "unproven", "held", "deferred")


def flags(rec: Continuation) -> frozenset[Flag]:
    """The flags ``rec`` carries, each a plain fact of the record:

    ``in_flight``: a delivery attempt is durably marked as started (the channel may be called
    now, or may have been before a crash). ``chunk_receipts``: some chunks of the answer have
    native receipts. ``unproven``: some post of this answer began and its outcome was never
    proven (sticky). ``held``: a ``delivery_retry`` with no automatic attempt scheduled; only an
    operator's retry moves it. ``deferred``: the origin run is not settled yet (a result waits).
    """
    found: set[Flag] = set()
    if rec.delivery_in_flight:
        found.add("in_flight")
    if rec.chunk_receipts:
        found.add("chunk_receipts")
    if rec.post_unproven or rec.state == "delivery_unknown":
        found.add("unproven")
    if rec.state == "delivery_retry" and rec.next_attempt_at_ms is None and not rec.delivery_in_flight:
        found.add("held")
    if rec.origin_context == "pending":
        found.add("deferred")
    return frozenset(found)


Verb = Literal[
    "cancel",
    "retry",
    "retry_allow_unknown",
    "resolve_delivered",
    "resolve_not_delivered",
    "resolve_dead_lettered",
    "acknowledge",
]

IN_FLIGHT_REFUSAL = (
    "a delivery attempt is in flight: the channel may already hold the answer, so {verb} now "
    "could hide or repeat that post; wait until the attempt ends (delivered, a retry scheduled, "
    "or delivery_unknown) and act on its outcome"
)
CHUNKS_REFUSAL = (
    "{count} chunk(s) of this answer have channel receipts, so part of it was delivered: "
    "{verb} would {effect}; record the outcome instead (resolve a delivery_unknown one as "
    "delivered DELIVERY_ID, with the id of the last part you find, or dead-lettered; "
    "acknowledge a dead letter)"
)
UNPROVEN_REFUSAL = (
    "an earlier post of this answer has an unknown outcome, so posting again could duplicate it: "
    "resolve it, or after checking the channel retry with --allow-unknown "
    "(HTTP allowUnknown: true, embedded allow_unknown=True)"
)

# verb -> the flags that refuse it, in the order they are checked, each with why. A flag not
# listed for a verb does not stop it (the state row still has to allow the verb's event).
OPERATOR_REFUSALS: Mapping[Verb, Mapping[Flag, str]] = {
    "cancel": {
        "in_flight": IN_FLIGHT_REFUSAL,
        "chunk_receipts": CHUNKS_REFUSAL.replace("{effect}", "hide a delivery"),
    },
    "retry": {
        "in_flight": IN_FLIGHT_REFUSAL,
        "chunk_receipts": CHUNKS_REFUSAL.replace("{effect}", "post those parts a second time"),
        "unproven": UNPROVEN_REFUSAL,
    },
    "retry_allow_unknown": {
        "in_flight": IN_FLIGHT_REFUSAL,
        "chunk_receipts": CHUNKS_REFUSAL.replace("{effect}", "post those parts a second time"),
    },
    "resolve_delivered": {"in_flight": IN_FLIGHT_REFUSAL},
    "resolve_not_delivered": {
        "in_flight": IN_FLIGHT_REFUSAL,
        "chunk_receipts": CHUNKS_REFUSAL.replace("{effect}", "contradict those receipts and drop them"),
    },
    "resolve_dead_lettered": {"in_flight": IN_FLIGHT_REFUSAL},
    "acknowledge": {"in_flight": IN_FLIGHT_REFUSAL},
}


def operator_refusal(rec: Continuation, verb: Verb) -> str | None:
    """Why ``verb`` may not act on ``rec`` because of a flag it carries, or None."""
    carried = flags(rec)
    for flag, why in OPERATOR_REFUSALS[verb].items():
        if flag in carried:
            name = verb.replace("_allow_unknown", " --allow-unknown").replace("_", " ")
            return why.format(verb=name, count=len(rec.chunk_receipts))
    return None

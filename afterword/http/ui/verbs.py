"""The operator verbs the status page offers, what each confirmation says, and which apply.

Which verbs a record offers comes from the lifecycle table (``TRANSITIONS``), so the page
never offers a button the service would refuse for the state alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...continuations.transitions import TRANSITIONS
from ...protocol.wire import StatusBody

# Restated from the durable-continuations spec on every confirmation that can lead to a post.
UNSAFE_RETRY_WARNING = (
    "An answer whose post was started but never confirmed may already be in the conversation. "
    "afterword never posts such an answer again on its own, and a normal retry refuses it: a "
    "second post could show people the same message twice. Check the channel first. If the "
    "message is there, resolve it as delivered with its delivery id; if it is not, resolve it "
    "as not delivered and then retry. Retrying with 'allow unknown' is only for when you have "
    "proved outside afterword that another post cannot duplicate anything; it does not stand "
    "in for resolving the outcome."
)


@dataclass(frozen=True)
class Verb:
    name: str
    title: str
    button: str
    explains: str
    done: str
    warn: bool = False  # show the unsafe-retry warning
    danger: bool = False


VERBS: dict[str, Verb] = {
    v.name: v
    for v in (
        Verb(
            "retry",
            "Retry",
            "Retry now",
            "Schedules delivery again now (or synthesis, when no answer was prepared yet).",
            "Retried: the worker picks it up now.",
            warn=True,
        ),
        Verb(
            "retry-unknown",
            "Retry, allowing an unknown earlier post",
            "Retry and allow a possible duplicate",
            "Posts again although an earlier post of this answer was never proven not to have "
            "happened. Tick the box to confirm you checked the channel.",
            "Retried with 'allow unknown'.",
            warn=True,
            danger=True,
        ),
        Verb(
            "cancel",
            "Cancel",
            "Cancel this continuation",
            "Stops the work: no answer will be synthesized or delivered. Cannot be undone.",
            "Cancelled.",
            danger=True,
        ),
        Verb(
            "acknowledge",
            "Acknowledge",
            "Acknowledge",
            "Records that you have seen this outcome and gives it up: it stops counting against "
            "health, and retention then compacts it, dropping its payload and answer; a dead "
            "letter can no longer be retried after that. Retry it first if it should still go out.",
            "Acknowledged: retention compacts it at its next pass.",
            warn=True,
        ),
        Verb(
            "resolve-delivered",
            "Resolve as delivered",
            "Resolve as delivered",
            "You found the message in the channel. Give its delivery id; afterword records the "
            "receipt and appends the answer to history without posting anything.",
            "Resolved as delivered.",
            warn=True,
        ),
        Verb(
            "resolve-not-delivered",
            "Resolve as not delivered",
            "Resolve as not delivered",
            "You checked and the message is not in the channel. The answer is held for a retry "
            "(which will still need 'allow unknown').",
            "Resolved as not delivered: held for a retry.",
            warn=True,
        ),
        Verb(
            "resolve-dead-lettered",
            "Resolve as dead-lettered",
            "Resolve as dead-lettered",
            "Gives up on this answer without posting it.",
            "Resolved as dead-lettered.",
            warn=True,
            danger=True,
        ),
    )
}

_ACKNOWLEDGEABLE_STATES = frozenset({"dead_lettered", "expired"})


def verbs_for(status: StatusBody) -> list[Verb]:
    """The verbs that apply to a record in its current state, in display order."""
    row = TRANSITIONS.get(status.state, {})  # type: ignore[call-overload]
    names: list[str] = []
    if status.in_flight:
        return []  # every verb waits for the attempt's outcome (transitions.OPERATOR_REFUSALS)
    if status.state == "delivery_unknown":
        names += ["resolve-delivered", "resolve-not-delivered", "resolve-dead-lettered"]
    if not status.compacted and "retry_delivery" in row:
        names.append("retry-unknown" if status.post_unproven else "retry")
    if "cancel" in row:
        names.append("cancel")
    history_missing = (
        status.state == "delivered" and status.receipt is not None and not status.receipt.history_recorded
    )
    if status.acknowledged_at is None and (status.state in _ACKNOWLEDGEABLE_STATES or history_missing):
        names.append("acknowledge")
    return [VERBS[n] for n in names]

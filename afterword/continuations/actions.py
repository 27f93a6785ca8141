"""What to do next with a continuation record, decided from the record and the time alone.

:func:`next_action` is the h11 ``next_event()`` of the lifecycle: given a record and the
time, it says what the I/O layer should do next (expire it, synthesize, deliver, hold an
unproven post, wait until a moment, or nothing). It reads no clock and performs nothing; the
worker does the I/O. The transition table itself lives in :mod:`.transitions` and is
re-exported here.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

import msgspec

from . import lifecycle
from .lifecycle import may_post
from .model import TERMINAL, Continuation
from .transitions import TRANSITIONS, Event, flags, target

__all__ = [
    "TRANSITIONS",
    "Action",
    "ActionKind",
    "Event",
    "SynthesisPlan",
    "after_restart",
    "answer_starts_delivery",
    "next_action",
    "synthesis_plan",
    "target",
]


ActionKind = Literal["expire", "synthesize", "deliver", "hold", "wait", "none"]


class Action(msgspec.Struct, frozen=True, kw_only=True):
    """What the I/O layer should do next with one record.

    ``expire`` / ``synthesize`` / ``deliver``: run that step now. ``hold``: the record is due
    but its earlier post was never proven, so park it for the operator instead of posting.
    ``wait``: nothing is due before ``at_ms`` (check again then). ``none``: nothing will become
    due by time alone (terminal, in flight, waiting on its origin run or on an operator).
    """

    kind: ActionKind
    at_ms: int | None = None


NONE = Action(kind="none")


def next_action(rec: Continuation, now_ms: int) -> Action:
    """The next step for ``rec`` at ``now_ms`` (pure: reads no clock, changes nothing).

    Besides the state it reads the record's flags (:func:`.transitions.flags`), the same ones
    that decide whether an operator verb may act: a post in flight is left alone, a deferred
    result waits for its origin, a held retry for an operator, and an unproven post is held
    instead of posted unless the operator opted in."""
    if rec.state in TERMINAL or rec.state == "synthesizing":
        return NONE  # before the flags: most records of a large set are finished
    carried = flags(rec)
    if "in_flight" in carried:
        return NONE
    if rec.state == "claimed":
        # A result is still accepted at the deadline itself; it expires one ms after.
        if now_ms > rec.claim.deadline_ms:
            return Action(kind="expire")
        return Action(kind="wait", at_ms=rec.claim.deadline_ms + 1)
    if rec.state == "result_received":
        return NONE if "deferred" in carried else Action(kind="synthesize")
    if "held" in carried:
        return NONE  # held for an operator's retry
    if (
        rec.state == "delivery_retry"
        and rec.next_attempt_at_ms is not None
        and rec.next_attempt_at_ms > now_ms
    ):
        return Action(kind="wait", at_ms=rec.next_attempt_at_ms)
    # ready_to_deliver, or a retry that is due. An answer whose earlier post was never proven
    # posts only after the operator's opt-in, however it became due (lifecycle invariant 5).
    return Action(kind="deliver") if may_post(rec) else Action(kind="hold")


class SynthesisPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How the worker commits one synthesis.

    ``start``: the event committed before the synthesizer is called (None: nothing is).
    ``finish``: the event that commits the answer. ``interrupted``: what a stop during the call
    commits, ``fail_synthesis`` (dead-lettered) or None (the record is left as it was).
    """

    start: Event | None
    finish: Event
    interrupted: Event | None


# A model may have answered, spent tokens or logged the payload before an interruption: the
# start is durable first and an interruption is never repeated (lifecycle invariant 2).
REMOTE_PLAN = SynthesisPlan(start="begin_synthesis", finish="finish_synthesis", interrupted="fail_synthesis")
# A local synthesizer touches nothing outside the process: until its answer commits there is
# nothing to be ambiguous about, so one commit suffices and a run lost to a crash or a stop
# leaves ``result_received``, to be synthesized again with the same outcome.
LOCAL_PLAN = SynthesisPlan(start=None, finish="synthesize_locally", interrupted=None)


def synthesis_plan(local: bool) -> SynthesisPlan:
    """The commits of one synthesis: ``local`` is True only for a synthesizer that is pure and
    deterministic and calls nothing outside the process (the template renderer)."""
    return LOCAL_PLAN if local else REMOTE_PLAN


def answer_starts_delivery(rec: Continuation, *, channel_reconciles: bool) -> bool:
    """Whether a local synthesizer's answer for ``rec`` (still ``result_received``) may be
    committed together with the start of its delivery: the text and the in-flight mark in one
    commit (``lifecycle.synthesize_locally(..., start_delivery=True)``).

    Only when the channel can reconcile: a crash after that commit is then settled from the
    channel (posted, or posted now), exactly as a crash after a separate in-flight commit
    would be. On a channel that cannot, the in-flight mark makes such a crash an unknown
    outcome for an operator, so the answer is committed on its own first and a crash before
    the post simply delivers it. Never for a capture (nothing is posted) or for a record that
    may not be posted without an operator (lifecycle invariant 5).
    """
    return (
        channel_reconciles
        and rec.state == "result_received"
        and not rec.deferred
        and rec.claim.mode != "capture"
        and may_post(rec)
    )


def after_restart(rec: Continuation, activated_ids: Collection[str] | None, now_ms: int) -> Continuation:
    """What startup recovery makes of ``rec`` (pure; returns ``rec`` itself when unchanged).

    ``activated_ids`` is the claim list of the group activation marker of ``rec``'s origin
    run, or None when no marker exists. The marker is the commit point: an interactive
    origin still pending is activated when the marker lists the claim and abandoned
    otherwise (the run died before its commit). Then synthesis or delivery that a stop
    interrupted is ended without being replayed (lifecycle.recover).
    """
    new = rec
    if new.origin_context == "pending" and new.claim.kind == "interactive":
        if activated_ids is not None and new.id in activated_ids:
            new = lifecycle.activate(new, now_ms)
        else:
            new = lifecycle.abandon(new, now_ms)
    recovered = lifecycle.recover(new, now_ms)
    return new if recovered is None else recovered

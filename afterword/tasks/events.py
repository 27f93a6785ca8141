"""What the runtime tells a host about a session on its own initiative.

A host's UI must show what happens without the user asking: an automatic turn's replies, a
notification entering the conversation, a session that cannot move on. The coordinator calls
the host's ``on_event`` callback with a :class:`SessionEvent` for each, from the task that
made it happen; the callback must not block (hand the event to a queue or a stream).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import msgspec

from ..history import Message
from .toolloop import TurnResult

_log = logging.getLogger(__name__)

EventKind = Literal["automatic_turn", "notifications", "stalled"]
# Wake answers that mean the session will not move on by itself: a tool call waits for a
# result nobody is going to write, or the model failed too often. The host must act.
STALLED_REASONS = frozenset({"tool_call_open", "retries_exhausted"})


class SessionEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One thing that happened in a session without a host call asking for it.

    * ``automatic_turn``: ``turn`` is the turn the coordinator ran (its replies, tool results
      and any calls left open);
    * ``notifications``: ``messages`` are task notifications just written into the session;
    * ``stalled``: the session cannot advance by itself; ``reason`` is ``tool_call_open``
      (answer the open calls) or ``retries_exhausted`` (model steps kept failing; new user
      input resumes it).
    """

    session_id: str
    kind: EventKind
    reason: str = ""
    turn: TurnResult | None = None
    messages: tuple[Message, ...] = ()


EventSink = Callable[[SessionEvent], None]


def emit(sink: EventSink | None, event: SessionEvent) -> None:
    """Hand ``event`` to the host; a failing callback is logged and never stops the runtime."""
    if sink is None:
        return
    try:
        sink(event)
    except Exception:
        _log.exception("the host's on_event callback failed for a %s event", event.kind)

"""The state history an operator reads in ``afterword continuations show`` (pure).

Applied once, where every new record version is committed, so no transition has to remember
it. The history is bounded: the first entry (when the claim was made) and the most recent
ones are kept, which is what an operator needs to tell how a record got where it is.
"""

from __future__ import annotations

import msgspec

from .model import Continuation, StateChange

MAX_STATE_HISTORY = 32


def record_change(stored: Continuation | None, new: Continuation, now_ms: int) -> Continuation:
    """``new`` with its state history and cumulative delivery attempts carried forward.

    ``stored`` is the latest committed version (None for a new record). The history always
    continues from ``stored``, never from ``new``: a caller deriving ``new`` from an older copy
    cannot drop entries. An entry is appended when the state differs from the stored one.
    """
    base = stored.history if stored is not None else ()
    history = base
    if stored is None or stored.state != new.state:
        at = new.updated_at_ms or now_ms
        entry = StateChange(state=new.state, at_ms=at, error=new.last_error.code if new.last_error else None)
        history = (*base, entry)
        if len(history) > MAX_STATE_HISTORY:
            history = (history[0], *history[-(MAX_STATE_HISTORY - 1) :])
    before = stored.delivery_attempts_before if stored is not None else new.delivery_attempts_before
    if stored is not None and new.attempts.delivery < stored.attempts.delivery:
        # An operator retry started a new round of delivery attempts; keep the earlier ones.
        before += stored.attempts.delivery
    if history is new.history and before == new.delivery_attempts_before:
        return new
    return msgspec.structs.replace(new, history=history, delivery_attempts_before=before)

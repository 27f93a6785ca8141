"""Compaction handoff: a summary that must not erase background tasks.

When a host compacts a long conversation into a summary, the summary alone would drop the
notifications it replaced. The handoff message therefore carries, next to the summary, a
reference to every task that is still running or whose terminal fact the model has not yet
handled. The turn runner's context starts at the latest handoff, and a task carried there
counts as seen, so it is consumed by the next successful step rather than forgotten.
"""

from __future__ import annotations

from ..history import ConversationHistory, Message
from . import core
from .journal import TaskJournal
from .records import TaskReference
from .render import render_handoff


class Compaction:
    """Writes compaction handoff messages carrying active and unconsumed task references."""

    def __init__(self, journal: TaskJournal, history: ConversationHistory) -> None:
        self.journal = journal
        self.history = history

    def references(self, session_id: str) -> list[TaskReference]:
        """What a handoff of this session must carry (for hosts that write their own)."""
        return core.handoff_references(self.journal.tasks(session_id))

    async def handoff(self, session_id: str, summary: str, *, handoff_id: str) -> Message:
        """Append the handoff message (idempotent by ``handoff_id``) and return it."""
        message = render_handoff(handoff_id, summary, self.references(session_id))
        await self.history.append(session_id, [message])
        return message

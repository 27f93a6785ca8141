"""Compaction handoff: a summary that must not erase background tasks, nor split a tool call
from its result.

When a host compacts a long conversation into a summary, the summary alone would drop the
notifications it replaced. The handoff message therefore carries, next to the summary, a
reference to every task that is still running or whose terminal fact the model has not yet
handled. The turn runner's context starts at the latest handoff, and a task carried there
counts as seen, so it is consumed by the next successful step rather than forgotten.

The model's context starts at the handoff, so a handoff written between a tool call and its
result would leave the result without its call - a conversation providers reject. A handoff
is therefore written like a model step: under the session's step lock (it waits for a running
turn to end), and only while no tool call is open (checked in the same step as the append);
otherwise :class:`CompactionRefused`. Inside a turn the host holds itself, it compacts
through :meth:`HostTurn.compact <afterword.tasks.hostturn.HostTurn.compact>`.
"""

from __future__ import annotations

from ..history import BoundaryHistory, Message
from . import core
from .errors import CompactionRefused
from .journal import TaskJournal
from .records import TaskReference
from .render import render_handoff
from .turns import TurnRunner


class Compaction:
    """Writes compaction handoff messages carrying active and unconsumed task references.

    Args:
        runner: whose step lock a handoff takes; without one the caller must make sure no
            model step of the session runs meanwhile.
    """

    def __init__(
        self, journal: TaskJournal, history: BoundaryHistory, *, runner: TurnRunner | None = None
    ) -> None:
        self.journal = journal
        self.history = history
        self.runner = runner

    def references(self, session_id: str) -> list[TaskReference]:
        """What a handoff of this session must carry (for hosts that write their own)."""
        return core.handoff_references(self.journal.tasks(session_id))

    async def handoff(self, session_id: str, summary: str, *, handoff_id: str) -> Message:
        """Append the handoff message (idempotent by ``handoff_id``) and return it.

        Waits for a running turn of the session to end first.

        Raises:
            CompactionRefused: a tool call of the session is waiting for its result.
        """
        if self.runner is None:
            return await self.handoff_locked(session_id, summary, handoff_id=handoff_id)
        async with self.runner.lock(session_id):
            return await self.handoff_locked(session_id, summary, handoff_id=handoff_id)

    async def handoff_locked(self, session_id: str, summary: str, *, handoff_id: str) -> Message:
        """:meth:`handoff` for a caller that already holds the session's step lock."""
        message = render_handoff(handoff_id, summary, self.references(session_id))
        if not await self.history.append_at_boundary(session_id, [message]):
            raise CompactionRefused(session_id)
        return message

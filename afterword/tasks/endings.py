"""``EndRecorder``: turning a finished process into the task's terminal record.

Whoever notices that a task's process is gone - the supervisor that spawned it, or the one
that adopted it after a restart - records the end the same way: the wrapper's exit record
if there is one (it is exact), otherwise the return code the supervisor saw, otherwise an
end nobody observed. A cancel asked for from another process is picked up first, so it
counts as the user's; the capture is bounded when the end is written. A task whose own
files are unusable ends with that fault; a fault of the journal's own state fails closed.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from ..disk import UnsafeStateError
from . import core, processes
from .children import bound_output, read_exit_status
from .journal import TaskJournal
from .records import TaskRecord


class EndRecorder:
    """Records how tasks of ``journal`` ended, keeping at most ``max_output_bytes`` of each capture."""

    def __init__(self, journal: TaskJournal, *, clock: Callable[[], float], max_output_bytes: int) -> None:
        self.journal = journal
        self.clock = clock
        self.max_output_bytes = max_output_bytes

    def read_status(self, task_id: str) -> tuple[core.ExitStatus | None, str | None]:
        """The wrapper's record, or why the task's own status file cannot be trusted."""
        try:
            return read_exit_status(self.journal.root, task_id), None
        except UnsafeStateError as exc:
            fault = self.journal.task_file_fault(task_id, exc)
            if fault is None:
                raise  # the journal's own state: fail closed
            return None, fault

    async def pick_up_cancel(self, task_id: str) -> TaskRecord:
        """A cancel asked for from another process (``afterword tasks cancel``) left a request
        file; before an end is classified it becomes the user's cancel, as if asked here."""
        task = self.journal.require(task_id)
        if task.cancel_requested or core.is_terminal(task):
            return task
        if not self.journal.root.exists(self.journal.cancel_request_path(task_id)):
            return task
        return await self.journal.update(task_id, core.request_cancel)

    async def record_end(
        self,
        task_id: str,
        status: core.ExitStatus | None,
        returncode: int | None,
        *,
        fault: str | None = None,
    ) -> TaskRecord:
        task = await self.pick_up_cancel(task_id)
        if status is not None:
            outcome = core.recorded_end(task, status)
        elif returncode is not None:
            outcome = core.classify_exit(
                returncode,
                cancel_requested=task.cancel_requested,
                stop_requested=task.stop_requested,
                timed_out=processes.timed_out_error(task) if task.timed_out else None,
            )
        else:
            outcome = core.unsupervised_end(task)
        if fault is not None:
            outcome = core.task_file_fault(outcome, fault)
        return await self.terminate(task_id, outcome, exact=status is not None or returncode is not None)

    async def terminate(self, task_id: str, outcome: core.Outcome, *, exact: bool) -> TaskRecord:
        """Write ``outcome`` as the task's end; ``exact`` when the end was observed, not inferred."""
        try:
            total, truncated = await anyio.to_thread.run_sync(
                bound_output, self.journal.root, self.journal.output_path(task_id), self.max_output_bytes
            )
        except UnsafeStateError as exc:
            fault = self.journal.task_file_fault(task_id, exc)
            if fault is None:
                raise  # the journal's own state: fail closed
            # The capture is not read or cut: the task alone pays for what it did to it.
            outcome, total, truncated = core.task_file_fault(outcome, fault), 0, True
        return await self.journal.update(
            task_id,
            lambda t: core.terminate(
                t,
                outcome,
                now=self.clock(),
                output_bytes=max(t.output_bytes, total),
                # Without the wrapper's record, whatever was printed unobserved is unknown.
                output_truncated=truncated or not exact,
            ),
        )

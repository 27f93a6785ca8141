"""``Adoption``: accounting for the tasks a previous supervisor left ``running``.

A restarted supervisor cannot ``wait()`` for processes it did not spawn. For each such task
it finds the process (by the recorded pid and identity, or - if the pid never became durable
- by the wrapper's command line), then either adopts it and polls it until it ends, or
records the end from the wrapper's exit record. Only a task with no such record becomes
``lost``, and only once nothing of its process group still runs: leftovers are killed
first, and a task whose leftovers survive stays ``running`` and is followed until they are
gone.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Collection

import anyio
from anyio.abc import TaskGroup

from . import core, procinfo
from .children import signal_group
from .endings import EndRecorder
from .journal import TaskJournal
from .records import TaskRecord


class Adoption:
    """Recovers the tasks of ``journal`` left running and watches those it adopts.

    Args:
        group: the supervisor's task group, where adopted tasks are watched.
        on_adopted: called with each adopted task's record (the supervisor arms its timeout).
        kill_grace: seconds leftovers of a lost task get to die after SIGKILL.
        poll_interval: how often an adopted process is checked.
    """

    def __init__(
        self,
        journal: TaskJournal,
        ends: EndRecorder,
        *,
        group: Callable[[], TaskGroup],
        on_adopted: Callable[[TaskRecord], None],
        clock: Callable[[], float],
        kill_grace: float,
        poll_interval: float,
    ) -> None:
        self.journal = journal
        self.ends = ends
        self.group = group
        self.on_adopted = on_adopted
        self.clock = clock
        self.kill_grace = kill_grace
        self.poll_interval = poll_interval
        self._adopted: set[str] = set()

    def watching(self) -> frozenset[str]:
        """Ids of the adopted tasks still being followed."""
        return frozenset(self._adopted)

    async def recover(self, skip: Collection[str] = ()) -> list[TaskRecord]:
        """Adopt or end every ``running`` task, except those in ``skip`` (watched already)."""
        changed: list[TaskRecord] = []
        for task in self.journal.tasks():
            if task.state != "running" or task.task_id in skip or task.task_id in self._adopted:
                continue
            task = await self.ends.pick_up_cancel(task.task_id)
            if task.pid is None:
                task = await self._find_unrecorded(task)
            probe = procinfo.probe(task.pid, task.process_identity) if task.pid is not None else "unknown"
            status, fault = self.ends.read_status(task.task_id) if probe != "alive" else (None, None)
            action, outcome = core.recovery_action(task, probe, status)
            if fault is not None and outcome is not None:
                outcome = core.task_file_fault(outcome, fault)
            if action == "adopt":
                changed.append(await self._adopt(task.task_id))
            elif action == "end" and outcome is not None:
                if status is None and fault is None:
                    ended = await self._end_unaccounted(task.task_id, outcome)
                    changed.append(ended if ended is not None else await self._adopt(task.task_id))
                else:
                    changed.append(await self.ends.terminate(task.task_id, outcome, exact=status is not None))
        return changed

    async def _adopt(self, task_id: str) -> TaskRecord:
        record = await self.journal.update(task_id, core.adopted)
        self._adopted.add(task_id)
        self.group().start_soon(self._watch, task_id)
        self.on_adopted(record)
        return record

    async def _find_unrecorded(self, task: TaskRecord) -> TaskRecord:
        """A task whose pid never became durable: its wrapper, if it runs, names the task's
        status file on its command line; found, it is recorded and can be adopted."""
        status = self.journal.root.path(TaskJournal.exit_status_path(task.task_id))
        pid = procinfo.find_by_argument(status)
        identity = procinfo.process_identity(pid) if pid is not None else None
        if pid is None or identity is None:
            return task
        return await self.journal.update(
            task.task_id, lambda t: core.spawned(t, pid=pid, identity=identity, now=self.clock())
        )

    async def _end_unaccounted(self, task_id: str, outcome: core.Outcome) -> TaskRecord | None:
        """Record an end nobody observed (``lost``) only once nothing of the task still runs.

        The wrapper is gone, but the command it started may live on in its process group:
        those processes are killed first. None if some survive; the task stays ``running``
        and is followed until they are gone.
        """
        task = self.journal.require(task_id)
        if task.pid is None:
            return await self.ends.terminate(task_id, outcome, exact=False)
        stopped = procinfo.leftovers(task.pid, task.process_identity)
        if stopped:
            signal_group(task.pid, signal.SIGKILL)
            with anyio.move_on_after(self.kill_grace):
                while procinfo.leftovers(task.pid, task.process_identity):
                    await anyio.sleep(min(self.poll_interval, 0.05))
            if procinfo.leftovers(task.pid, task.process_identity):
                return None
        return await self.ends.terminate(task_id, core.leftovers_stopped(outcome, len(stopped)), exact=False)

    async def _watch(self, task_id: str) -> None:
        try:
            while True:
                task = self.journal.require(task_id)
                if task.state != "running":
                    return
                assert task.pid is not None
                if procinfo.probe(task.pid, task.process_identity) != "alive":
                    with anyio.CancelScope(shield=True):
                        status, fault = self.ends.read_status(task_id)
                        if status is not None or fault is not None:
                            await self.ends.record_end(task_id, status, None, fault=fault)
                            return
                        if await self._end_unaccounted(task_id, core.unsupervised_end(task)) is not None:
                            return
                await anyio.sleep(self.poll_interval)
        finally:
            self._adopted.discard(task_id)

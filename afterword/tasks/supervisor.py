"""``ProcessSupervisor``: runs background commands and records how they end.

The supervisor owns the process fact and nothing else. It writes the task record *before*
spawning (so no process exists that the journal does not know about), records the pid and the
process identity right after, and when the process ends records the terminal state with its
stable event id - whether or not the tool call that started it has returned yet.

Every command runs under a small wrapper (:mod:`afterword.tasks.exitwrap`) that writes the
command's exit status durably next to its output when it ends. The command writes its
combined stdout/stderr straight into an owner-only file (no pipe through the supervisor), so
a supervisor that dies - even by SIGKILL - takes neither the command nor its capture down.
The capture is bounded when the end is recorded: head and tail kept, the middle counted.

After a restart the supervisor cannot ``wait()`` for processes a previous life started. A task
whose recorded process is provably still alive is adopted and polled; when it ends, the
wrapper's record says how. Only a task without such a record - its wrapper was SIGKILLed, or
its pid was never recorded - becomes ``lost``, which says honestly that the journal does not
know whether the command's side effects happened.

Leaving the supervisor's context is a host shutdown, not a user's cancel: by default the
processes keep running for the next supervisor to adopt (``on_exit="detach"``); with
``on_exit="stop"`` they are stopped and recorded as ``killed`` with a cause the model is told.

Children run in their own session and process group, so a terminal's Ctrl-C does not reach
them and a cancellation reaches their whole group.

How an end is recorded is :class:`~afterword.tasks.endings.EndRecorder`'s, shared by the
watchers of spawned and of adopted tasks; accounting for what a previous life left running
is :class:`~afterword.tasks.adoption.Adoption`'s. The supervisor keeps the processes it
spawned, their timeouts, and cancel and stop.
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Literal

import anyio
from anyio.abc import TaskGroup

from . import core, procinfo
from .adoption import Adoption
from .children import (
    DEFAULT_MAX_OUTPUT,
    MARKER_SLACK,
    bound_output,
    signal_group,
    signal_pid,
    spawn_wrapped,
    wait_exit,
)
from .endings import EndRecorder
from .errors import SupervisorError
from .journal import OUTPUT_DIR, TaskJournal
from .records import NotifyPolicy, TaskRecord

__all__ = ["DEFAULT_MAX_OUTPUT", "MARKER_SLACK", "OnExit", "ProcessSupervisor", "bound_output", "new_task_id"]

OnExit = Literal["detach", "stop"]
# Wrappers a detached supervisor stopped watching; kept so they are reaped, not warned about.
_detached: list[subprocess.Popen[bytes]] = []


def new_task_id() -> str:
    return "task_" + secrets.token_hex(8)


class ProcessSupervisor:
    """Starts commands for a :class:`TaskJournal` and records their ends.

    Use as ``async with ProcessSupervisor(journal) as supervisor:``. Entering recovers tasks a
    previous life left ``running``; leaving detaches from (or, with ``on_exit="stop"``,
    stops) the processes still running.

    Args:
        clock: seconds since the epoch (injected for tests).
        max_output_bytes: per task; the rest is counted and omitted from the middle.
        kill_grace: seconds between SIGTERM and SIGKILL when cancelling or stopping.
        poll_interval: how often an adopted process is checked.
        on_exit: ``"detach"`` leaves running processes for the next supervisor to adopt;
            ``"stop"`` stops them and records them ``killed`` because the host shut down.
    """

    def __init__(
        self,
        journal: TaskJournal,
        *,
        clock: Callable[[], float] = time.time,
        new_id: Callable[[], str] = new_task_id,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT,
        kill_grace: float = 5.0,
        poll_interval: float = 0.5,
        on_exit: OnExit = "detach",
    ) -> None:
        if max_output_bytes < 2:
            raise ValueError("output limit must be at least 2 bytes")
        if on_exit not in ("detach", "stop"):
            raise ValueError("on_exit must be 'detach' or 'stop'")
        self.journal = journal
        self.clock = clock
        self.new_id = new_id
        self.max_output_bytes = max_output_bytes
        self.kill_grace = kill_grace
        self.poll_interval = poll_interval
        self.on_exit: OnExit = on_exit
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._ends = EndRecorder(journal, clock=clock, max_output_bytes=max_output_bytes)
        self._adoption = Adoption(
            journal,
            self._ends,
            group=self._group,
            on_adopted=self._arm_timeout,
            clock=clock,
            kill_grace=kill_grace,
            poll_interval=poll_interval,
        )
        self._ended: dict[str, anyio.Event] = {}
        self._unsubscribe = journal.subscribe(self._on_change)

    def _on_change(self, before: TaskRecord | None, after: TaskRecord | None) -> None:
        if after is not None and core.is_terminal(after):
            event = self._ended.get(after.task_id)
            if event is not None:
                event.set()

    # -- lifetime ------------------------------------------------------------------------------
    async def __aenter__(self) -> ProcessSupervisor:
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        try:
            await self.recover()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            if self.on_exit == "stop" and self.running():
                with anyio.CancelScope(shield=True):
                    async with anyio.create_task_group() as tg:
                        for task_id in self.running():
                            tg.start_soon(self.stop, task_id)
            assert self._tg is not None
            self._tg.cancel_scope.cancel()
        finally:
            self._tg = None
            self._unsubscribe()
            await stack.aclose()
            _detached[:] = [p for p in _detached if p.poll() is None]

    def _group(self) -> TaskGroup:
        if self._tg is None:
            raise SupervisorError("the supervisor is not running; use 'async with ProcessSupervisor(...)'")
        return self._tg

    # -- starting ------------------------------------------------------------------------------
    async def start(
        self,
        session_id: str,
        tool_call_id: str,
        command: Sequence[str],
        *,
        notify: NotifyPolicy = "on_exit",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        task_id: str | None = None,
        timeout: float | None = None,
    ) -> TaskRecord:
        """Record, then spawn, a background command. Returns the task as recorded.

        A command that cannot be spawned ends as ``failed`` with the reason (at once if even
        the wrapper cannot start, otherwise as soon as the wrapper reports it). With
        ``timeout`` (seconds), a command still running then is stopped like a cancel but
        ends ``killed`` with the timeout as its error, and is notified.
        """
        group = self._group()
        task_id = task_id or self.new_id()
        rel = self.journal.output_path(task_id)
        record = core.new_task(
            task_id=task_id,
            session_id=session_id,
            tool_call_id=tool_call_id,
            command=command,
            notify=notify,
            cwd=cwd,
            output_path=rel,
            now=self.clock(),
            timeout=timeout,
        )
        await self.journal.create(record)
        root = self.journal.root
        root.ensure_dir(OUTPUT_DIR)
        output = root.open_file(rel, writable=True, create=True)
        try:
            process = spawn_wrapped(root, task_id, command, output_fd=output.fd, cwd=cwd, env=env)
        except OSError as exc:
            outcome = core.spawn_failure(f"{type(exc).__name__}: {exc.strerror or exc}")
            return await self.journal.update(
                task_id, lambda t: core.terminate(t, outcome, now=self.clock(), output_bytes=0)
            )
        finally:
            root.close(output)  # the wrapper and the command hold their own descriptors
        self._procs[task_id] = process
        try:
            identity = procinfo.process_identity(process.pid)
            recorded = await self.journal.update(
                task_id, lambda t: core.spawned(t, pid=process.pid, identity=identity, now=self.clock())
            )
        except BaseException:
            # The pid never became durable: a process nobody can account for must not live on.
            signal_group(process.pid, signal.SIGKILL)
            group.start_soon(self._watch, task_id, process)
            raise
        group.start_soon(self._watch, task_id, process)
        self._arm_timeout(recorded)
        return recorded

    def _arm_timeout(self, task: TaskRecord) -> None:
        if task.timeout_at is not None and task.state == "running":
            self._group().start_soon(self._timeout, task.task_id, task.timeout_at)

    async def _timeout(self, task_id: str, at: float) -> None:
        await anyio.sleep(max(0.0, at - self.clock()))
        task = self.journal.require(task_id)
        if not core.is_terminal(task) and not task.cancel_requested:
            await self._halt(task_id, core.request_timeout)

    async def _watch(self, task_id: str, process: subprocess.Popen[bytes]) -> None:
        try:
            await wait_exit(process, self.poll_interval)
            returncode = process.wait()
            # Shielded: once the process has ended, its terminal state must be recorded even
            # if the supervisor is shutting down around us.
            with anyio.CancelScope(shield=True):
                self._procs.pop(task_id, None)
                status, fault = self._ends.read_status(task_id)
                if status is None and fault is None and returncode < 0:
                    # The wrapper itself was killed: make sure its command does not live on.
                    signal_group(process.pid, signal.SIGKILL)
                await self._ends.record_end(task_id, status, returncode, fault=fault)
        finally:
            self._procs.pop(task_id, None)
            if process.returncode is None:
                _detached.append(process)  # left running for the next life to adopt

    # -- recovery ------------------------------------------------------------------------------
    async def recover(self) -> list[TaskRecord]:
        """Account for tasks left ``running`` by a previous life: adopt them or end them."""
        return await self._adoption.recover(skip=self._procs)

    # -- waiting and cancelling ----------------------------------------------------------------
    async def wait(self, task_id: str, timeout: float | None = None) -> TaskRecord:
        """The task once terminal, or as it stands when ``timeout`` seconds have passed."""
        task = self.journal.require(task_id)
        if core.is_terminal(task):
            return task
        event = self._ended.setdefault(task_id, anyio.Event())
        try:
            with anyio.move_on_after(timeout):
                await event.wait()
        finally:
            if self._ended.get(task_id) is event and core.is_terminal(self.journal.require(task_id)):
                del self._ended[task_id]
        return self.journal.require(task_id)

    async def cancel(self, task_id: str) -> TaskRecord:
        """The user's cancel: record the intent, SIGTERM, SIGKILL after the grace. Not notified."""
        return await self._halt(task_id, core.request_cancel)

    async def stop(self, task_id: str) -> TaskRecord:
        """The host's stop at shutdown: like :meth:`cancel`, but the end is ``killed`` with
        :data:`core.HOST_STOPPED` as its cause, and the model is notified."""
        return await self._halt(task_id, core.request_stop)

    async def _halt(self, task_id: str, intent: Callable[[TaskRecord], TaskRecord]) -> TaskRecord:
        task = self.journal.require(task_id)
        if core.is_terminal(task):
            return task
        task = await self.journal.update(task_id, intent)
        process = self._procs.get(task_id)
        if process is not None:
            if process.returncode is not None:
                return await self.wait(task_id)  # reaped: the pid may already name another process
            pid = process.pid
        elif task_id in self._adoption.watching() and task.pid is not None:
            if procinfo.probe(task.pid, task.process_identity) != "alive":
                return await self.wait(task_id, self.poll_interval * 4)
            pid = task.pid
        else:
            return task  # not ours to signal; recovery decides its fate
        # The wrapper passes SIGTERM on to its whole group once and stays to record the end.
        signal_pid(pid, signal.SIGTERM)
        ended = await self.wait(task_id, self.kill_grace)
        if core.is_terminal(ended):
            return ended
        signal_group(pid, signal.SIGKILL)
        return await self.wait(task_id)

    def running(self) -> list[str]:
        """Task ids this supervisor is watching (started or adopted)."""
        return sorted({*self._procs, *self._adoption.watching()})

    def __repr__(self) -> str:
        return f"<ProcessSupervisor watching={len(self._procs)} adopted={len(self._adoption.watching())}>"

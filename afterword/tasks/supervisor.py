"""``ProcessSupervisor``: runs background commands and records how they end.

The supervisor owns the process fact and nothing else. It writes the task record *before*
spawning (so no process exists that the journal does not know about), records the pid and the
process identity right after, captures the combined stdout/stderr into a bounded file, and
when the process ends records the terminal state with its stable event id - whether or not
the tool call that started it has returned yet.

After a restart the supervisor cannot ``wait()`` for processes a previous life started. A task
whose recorded process is provably still alive is adopted and polled; when it disappears its
exit status is unknowable and it becomes ``lost``. A task whose process is already gone, or
whose pid was never recorded, becomes ``lost`` at once. ``lost`` says honestly that the
journal does not know whether the command's side effects happened.

Children run in their own session and process group, so a terminal's Ctrl-C does not reach
them and a cancellation reaches their whole group.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType

import anyio
from anyio.abc import Process, TaskGroup

from ..disk import FileHandle, StateRoot
from . import core, procinfo
from .errors import SupervisorError
from .journal import OUTPUT_DIR, TaskJournal
from .records import NotifyPolicy, TaskRecord

DEFAULT_MAX_OUTPUT = 1024 * 1024


def new_task_id() -> str:
    return "task_" + secrets.token_hex(8)


class OutputCapture:
    """Bounded capture of a process's output into one file through the disk seam.

    The first half of the budget is written as it arrives; later bytes go to an in-memory
    ring holding the second half. At the end, if anything fell between the two, a marker
    naming the omitted byte count separates head and tail. Output that fits the budget is
    stored exactly.
    """

    def __init__(self, root: StateRoot, rel: str, limit: int) -> None:
        if limit < 2:
            raise ValueError("output limit must be at least 2 bytes")
        root.ensure_dir(OUTPUT_DIR)
        self.root = root
        self.handle: FileHandle = root.open_file(rel, writable=True, create=True)
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.offset = 0
        self.total = 0
        self.tail = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - self.offset
        if room > 0 and not self.tail:
            head = chunk[:room]
            self.root.pwrite(self.handle, head, self.offset)
            self.offset += len(head)
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    def finish(self) -> tuple[int, bool]:
        """Write the tail, fsync, close; returns ``(bytes printed, truncated)``."""
        omitted = self.total - self.offset - len(self.tail)
        try:
            if omitted > 0:
                marker = f"\n[... {omitted} bytes of output omitted ...]\n".encode()
                self.root.pwrite(self.handle, marker + bytes(self.tail), self.offset)
            elif self.tail:
                self.root.pwrite(self.handle, bytes(self.tail), self.offset)
            self.root.fsync(self.handle)
        finally:
            self.root.close(self.handle)
        return self.total, omitted > 0


class ProcessSupervisor:
    """Starts commands for a :class:`TaskJournal` and records their ends.

    Use as ``async with ProcessSupervisor(journal) as supervisor:``. Entering recovers tasks a
    previous life left ``running``; leaving cancels the processes this life started (when
    ``terminate_on_exit``) and waits for their terminal states to be recorded.

    Args:
        clock: seconds since the epoch (injected for tests).
        max_output_bytes: per task; the rest is counted and omitted from the middle.
        drain_timeout: how long to keep reading after exit (a grandchild may hold the pipe).
        kill_grace: seconds between SIGTERM and SIGKILL when cancelling.
        poll_interval: how often an adopted process is checked.
    """

    def __init__(
        self,
        journal: TaskJournal,
        *,
        clock: Callable[[], float] = time.time,
        new_id: Callable[[], str] = new_task_id,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT,
        drain_timeout: float = 2.0,
        kill_grace: float = 5.0,
        poll_interval: float = 0.5,
        terminate_on_exit: bool = True,
    ) -> None:
        self.journal = journal
        self.clock = clock
        self.new_id = new_id
        self.max_output_bytes = max_output_bytes
        self.drain_timeout = drain_timeout
        self.kill_grace = kill_grace
        self.poll_interval = poll_interval
        self.terminate_on_exit = terminate_on_exit
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._procs: dict[str, Process] = {}
        self._adopted: set[str] = set()
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
            if self.terminate_on_exit and self._procs:
                with anyio.CancelScope(shield=True):
                    async with anyio.create_task_group() as tg:
                        for task_id in list(self._procs):
                            tg.start_soon(self.cancel, task_id)
            assert self._tg is not None
            self._tg.cancel_scope.cancel()
        finally:
            self._tg = None
            self._unsubscribe()
            await stack.aclose()

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
    ) -> TaskRecord:
        """Record, then spawn, a background command. Returns the task as recorded.

        A command that cannot be spawned ends at once as ``failed`` with the reason.
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
        )
        await self.journal.create(record)
        capture = OutputCapture(self.journal.root, rel, self.max_output_bytes)
        try:
            process = await anyio.open_process(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        except OSError as exc:
            total, truncated = capture.finish()
            outcome = core.spawn_failure(f"{type(exc).__name__}: {exc.strerror or exc}")
            return await self.journal.update(
                task_id,
                lambda t: core.terminate(
                    t, outcome, now=self.clock(), output_bytes=total, output_truncated=truncated
                ),
            )
        self._procs[task_id] = process
        try:
            identity = procinfo.process_identity(process.pid)
            recorded = await self.journal.update(
                task_id, lambda t: core.spawned(t, pid=process.pid, identity=identity, now=self.clock())
            )
        except BaseException:
            # The pid never became durable: a process nobody can account for must not live on.
            _signal_group(process.pid, signal.SIGKILL)
            group.start_soon(self._watch, task_id, process, capture)
            raise
        group.start_soon(self._watch, task_id, process, capture)
        return recorded

    async def _watch(self, task_id: str, process: Process, capture: OutputCapture) -> None:
        try:
            reader_done = anyio.Event()

            async def read() -> None:
                try:
                    assert process.stdout is not None
                    async for chunk in process.stdout:
                        capture.feed(chunk)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass
                finally:
                    reader_done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                returncode = await process.wait()
                with anyio.move_on_after(self.drain_timeout):
                    await reader_done.wait()
                tg.cancel_scope.cancel()
            # Shielded: once the process has ended, its terminal state must be recorded even
            # if the supervisor is shutting down around us.
            with anyio.CancelScope(shield=True):
                await process.aclose()
                total, truncated = await anyio.to_thread.run_sync(capture.finish)
                await self.journal.update(
                    task_id,
                    lambda t: core.terminate(
                        t,
                        core.classify_exit(returncode, cancel_requested=t.cancel_requested),
                        now=self.clock(),
                        output_bytes=total,
                        output_truncated=truncated,
                    ),
                )
        finally:
            self._procs.pop(task_id, None)

    # -- recovery ------------------------------------------------------------------------------
    async def recover(self) -> list[TaskRecord]:
        """Account for tasks left ``running`` by a previous life: adopt them or end them."""
        group = self._group()
        changed: list[TaskRecord] = []
        for task in self.journal.tasks():
            if task.state != "running" or task.task_id in self._procs or task.task_id in self._adopted:
                continue
            probe = procinfo.probe(task.pid, task.process_identity) if task.pid is not None else "unknown"
            action, outcome = core.recovery_action(task, probe)
            if action == "adopt":
                changed.append(await self.journal.update(task.task_id, core.adopted))
                self._adopted.add(task.task_id)
                group.start_soon(self._watch_adopted, task.task_id)
            elif action == "end" and outcome is not None:
                changed.append(await self._end_unsupervised(task.task_id, outcome))
        return changed

    async def _end_unsupervised(self, task_id: str, outcome: core.Outcome) -> TaskRecord:
        task = self.journal.require(task_id)
        captured = self._captured_size(task)
        return await self.journal.update(
            task_id,
            lambda t: core.terminate(
                t, outcome, now=self.clock(), output_bytes=max(t.output_bytes, captured),
                output_truncated=True,  # whatever the process printed unobserved is unknown
            ),
        )

    def _captured_size(self, task: TaskRecord) -> int:
        root = self.journal.root
        if not root.exists(task.output_path):
            return 0
        handle = root.open_file(task.output_path)
        try:
            return root.disk.fstat(handle.fd).st_size
        finally:
            root.close(handle)

    async def _watch_adopted(self, task_id: str) -> None:
        try:
            while True:
                task = self.journal.require(task_id)
                if task.state != "running":
                    return
                assert task.pid is not None
                if procinfo.probe(task.pid, task.process_identity) != "alive":
                    with anyio.CancelScope(shield=True):
                        await self._end_unsupervised(task_id, core.unsupervised_end(task))
                    return
                await anyio.sleep(self.poll_interval)
        finally:
            self._adopted.discard(task_id)

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
        """Stop a running task: record the intent, SIGTERM its group, SIGKILL after the grace."""
        task = self.journal.require(task_id)
        if core.is_terminal(task):
            return task
        task = await self.journal.update(task_id, core.request_cancel)
        process = self._procs.get(task_id)
        if process is not None:
            if process.returncode is not None:
                return await self.wait(task_id)  # reaped: the pid may already name another process
            pid = process.pid
        elif task_id in self._adopted and task.pid is not None:
            if procinfo.probe(task.pid, task.process_identity) != "alive":
                return await self.wait(task_id, self.poll_interval * 4)
            pid = task.pid
        else:
            return task  # not ours to signal; recovery decides its fate
        _signal_group(pid, signal.SIGTERM)
        ended = await self.wait(task_id, self.kill_grace)
        if core.is_terminal(ended):
            return ended
        _signal_group(pid, signal.SIGKILL)
        return await self.wait(task_id)

    def running(self) -> list[str]:
        """Task ids this supervisor is watching (started or adopted)."""
        return sorted({*self._procs, *self._adopted})

    def __repr__(self) -> str:
        return f"<ProcessSupervisor watching={len(self._procs)} adopted={len(self._adopted)}>"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        # The group leader exited and the id names nothing of ours any more.
        pass

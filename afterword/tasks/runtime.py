"""``TaskRuntime``: the task journal wired for a host in one call, with recovery in order.

A host needs eight objects built over one store in the right order, and recovery steps that
are easy to forget. :meth:`TaskRuntime.open` builds them all and runs recovery before it
returns:

1. the supervisor accounts for processes a previous life left running (adopts the live ones,
   reads the recorded exit status of the ended ones, ``lost`` only without a record);
2. tool results that reached the history but were not marked ``committed`` are marked;
3. notifications that reached the history but were not marked ``delivered`` are marked;
4. tool calls that a coordinator turn left open when the host crashed get an "interrupted"
   result, so they cannot block the session (conversations no such turn was running in are
   left alone);
5. the coordinator's background loop starts: it delivers what is ready and wakes every
   session that has something pending, then follows the journal.

Leaving the context stops the loop and the supervisor (``on_exit``: detach by default, so
running commands are adopted by the next start).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

from ..history import BoundaryHistory, DurableHistory, Message, ToolCall
from ..store import RecordStore
from .compaction import Compaction
from .coordinator import (
    DEFAULT_COALESCE_WINDOW,
    DEFAULT_MAX_TOOL_ROUNDS,
    ExecutionCoordinator,
    WakeResult,
    default_retry_delay,
)
from .events import EventSink
from .journal import TaskJournal
from .notifications import TaskNotifications
from .records import NotifyPolicy, TaskRecord
from .render import OutputChunk
from .supervisor import DEFAULT_MAX_OUTPUT, OnExit, ProcessSupervisor
from .toolcalls import ToolCallProcessor
from .toolloop import ToolExecutor, TurnResult
from .turns import DEFAULT_CONTEXT_LIMIT, DEFAULT_MAX_MODEL_FAILURES, ModelStep, TurnRunner


@dataclass
class TaskRuntime:
    """The wired task journal of one host (see the module docstring)."""

    journal: TaskJournal
    history: BoundaryHistory
    supervisor: ProcessSupervisor
    processor: ToolCallProcessor
    notifications: TaskNotifications
    runner: TurnRunner
    compaction: Compaction
    coordinator: ExecutionCoordinator
    _cursors: dict[str, int] = field(default_factory=dict)  # task id -> next unread byte

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        store: RecordStore,
        model_step: ModelStep,
        *,
        make_tools: Callable[[TaskRuntime], ToolExecutor] | None = None,
        history: BoundaryHistory | None = None,
        on_exit: OnExit = "detach",
        clock: Callable[[], float] = time.time,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT,
        max_model_failures: int = DEFAULT_MAX_MODEL_FAILURES,
        on_event: EventSink | None = None,
        max_tool_rounds: int = DEFAULT_MAX_TOOL_ROUNDS,
        context_limit: int = DEFAULT_CONTEXT_LIMIT,
        retry_delay: Callable[[int], float] = default_retry_delay,
        coalesce_window: float = DEFAULT_COALESCE_WINDOW,
    ) -> AsyncIterator[TaskRuntime]:
        """Build everything over ``store``, recover, start the background loop.

        Args:
            model_step: ``(session_id, context) -> replies``.
            make_tools: builds the host's tool executor from the runtime (it usually needs
                ``runtime.start_task``); without one, turns stop at tool calls and report them.
            on_event: called with a :class:`SessionEvent` for every automatic turn, every
                notification written and every session that cannot advance by itself; it
                runs on the runtime's tasks and must not block.
            max_tool_rounds: tool rounds one turn may run (see ``ExecutionCoordinator``).
            context_limit: how many of the newest messages a model step sees at most.
            retry_delay: seconds before a failed automatic step is retried, by failure count.
            coalesce_window: seconds a session's first change waits for others to join it.
        """
        if max_tool_rounds < 1 or context_limit < 1 or coalesce_window < 0:
            raise ValueError("max_tool_rounds and context_limit must be >= 1, coalesce_window >= 0")
        journal = TaskJournal(store)
        history = history if history is not None else DurableHistory(store)
        notifications = TaskNotifications(journal, history, clock=clock)
        processor = ToolCallProcessor(journal, history, clock=clock)
        runner = TurnRunner(
            history,
            journal,
            notifications,
            model_step,
            clock=clock,
            max_model_failures=max_model_failures,
            context_limit=context_limit,
        )
        coordinator = ExecutionCoordinator(
            journal,
            notifications,
            runner,
            processor=processor,
            clock=clock,
            on_event=on_event,
            max_tool_rounds=max_tool_rounds,
            retry_delay=retry_delay,
            coalesce_window=coalesce_window,
        )
        supervisor = ProcessSupervisor(
            journal, clock=clock, on_exit=on_exit, max_output_bytes=max_output_bytes
        )
        async with supervisor:  # step 1
            runtime = cls(
                journal=journal,
                history=history,
                supervisor=supervisor,
                processor=processor,
                notifications=notifications,
                runner=runner,
                compaction=Compaction(journal, history, runner=runner),
                coordinator=coordinator,
            )
            if make_tools is not None:
                coordinator.tools = make_tools(runtime)
            await processor.recover()  # step 2
            await notifications.reconcile()  # step 3
            for control in journal.controls():  # step 4
                if control.turn_open:
                    await coordinator.close_open_calls(control.session_id)
            async with anyio.create_task_group() as tg:
                await tg.start(coordinator.run)  # step 5
                try:
                    yield runtime
                finally:
                    tg.cancel_scope.cancel()

    # -- what a host calls ---------------------------------------------------------------------
    async def user_turn(self, session_id: str, message: Message) -> TurnResult:
        return await self.coordinator.user_turn(session_id, message)

    async def wake(self, session_id: str) -> WakeResult:
        return await self.coordinator.wake(session_id)

    def read_new_output(self, task_id: str, max_bytes: int = 4096) -> OutputChunk:
        """What the task printed since the previous call (for a ``task_output`` tool).

        The cursor lives in this runtime: after a restart the first read starts from the
        beginning. Pass offsets to :meth:`TaskJournal.read_output` to keep your own.
        """
        chunk = self.journal.read_output(
            self.journal.require(task_id), self._cursors.get(task_id, 0), max_bytes
        )
        self._cursors[task_id] = chunk.next_offset
        return chunk

    async def cancel_task(self, task_id: str) -> TaskRecord:
        """The user's cancel: the command is stopped and its end is not notified."""
        return await self.supervisor.cancel(task_id)

    async def start_task(
        self,
        session_id: str,
        call: ToolCall,
        command: Sequence[str],
        *,
        notify: NotifyPolicy = "on_exit",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> TaskRecord:
        """Start a background command on behalf of tool call ``call`` (from a tool executor).

        ``timeout``: seconds after which a command still running is stopped; it then ends
        ``killed`` with the timeout as its error and is notified like any ending.
        """
        return await self.supervisor.start(
            session_id, call.id, command, notify=notify, cwd=cwd, env=env, timeout=timeout
        )

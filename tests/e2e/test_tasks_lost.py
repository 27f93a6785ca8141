"""``lost`` is recorded only once nothing of the task still runs (issue 30, point 6).

The wrapper leads the task's process group. When it is SIGKILLed on its own, the command it
started lives on in that group; recording ``lost`` then would be untrue, and the command's
side effects would happen after the journal gave up on it. The supervisor kills what is left
of the group first, both for a task it finds so at a restart and for one it adopted.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from test_tasks_supervisor import OPTIONS, orphaned_child, supervised  # noqa: F401 (fixture)

from afterword.store import RecordStore
from afterword.tasks import TaskJournal, core, procinfo


def command_pids(wrapper: int, identity: str | None) -> list[int]:
    """The command's processes under the wrapper (waits for the wrapper to have started it)."""
    deadline = time.monotonic() + 20
    while True:
        found = [p for p in procinfo.leftovers(wrapper, identity) if p != wrapper]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def kill_wrapper_only(wrapper: int) -> None:
    os.kill(wrapper, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while procinfo.probe(wrapper, procinfo.process_identity(wrapper)) == "alive":
        assert time.monotonic() < deadline
        time.sleep(0.02)


def alive(pids: list[int]) -> list[int]:
    def running(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False

    return [p for p in pids if running(p)]


@pytest.mark.anyio
async def test_a_wrapper_killed_before_the_restart_takes_its_command_with_it(
    state_dir: str,
    orphaned_child: int,  # noqa: F811
) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        identity = TaskJournal(store).require("t-restart").process_identity
    command = command_pids(orphaned_child, identity)
    assert command  # `sleep 120` under the wrapper
    kill_wrapper_only(orphaned_child)
    assert alive(command)  # the command outlived its wrapper
    async with supervised(state_dir) as (journal, sup):
        task = journal.require("t-restart")
        assert sup.running() == []
    assert task.state == "lost" and task.error is not None
    assert task.error.startswith(core.LOST_VANISHED) and "were killed before this was recorded" in task.error
    assert not alive(command)


@pytest.mark.anyio
async def test_an_adopted_task_whose_wrapper_dies_is_lost_only_after_its_command(
    state_dir: str,
    orphaned_child: int,  # noqa: F811
) -> None:
    async with supervised(state_dir) as (journal, sup):
        adopted = journal.require("t-restart")
        assert adopted.adopted
        command = command_pids(orphaned_child, adopted.process_identity)
        assert command
        kill_wrapper_only(orphaned_child)
        done = await sup.wait("t-restart", timeout=30)
        assert not alive(command)  # stopped before the end was recorded
    assert done.state == "lost" and done.error is not None
    assert done.error.startswith(core.LOST_UNSUPERVISED_EXIT) and "were killed" in done.error


@pytest.mark.anyio
async def test_a_running_wrapper_whose_pid_was_never_recorded_is_found_and_adopted(state_dir: str) -> None:
    # A crash between spawning and recording the pid: the command runs, the journal has no pid.
    # Calling it lost would be untrue; its wrapper names the task on its command line.
    from afterword.tasks.children import spawn_wrapped

    with RecordStore.open(state_dir, options=OPTIONS) as store:
        journal = TaskJournal(store)
        await journal.create(
            core.new_task(
                task_id="t-unrecorded",
                session_id="s",
                tool_call_id="c",
                command=["sleep", "60"],
                notify="on_exit",
                cwd=None,
                output_path=journal.output_path("t-unrecorded"),
                now=time.time(),
            )
        )
        journal.root.ensure_dir("tasks")
        out = journal.root.open_file(journal.output_path("t-unrecorded"), writable=True, create=True)
        wrapper = spawn_wrapped(
            journal.root, "t-unrecorded", ["sleep", "60"], output_fd=out.fd, cwd=None, env=None
        )
        journal.root.close(out)
    try:
        async with supervised(state_dir) as (journal, sup):
            adopted = journal.require("t-unrecorded")
            assert adopted.state == "running" and adopted.adopted and adopted.pid == wrapper.pid
            ended = await sup.cancel("t-unrecorded")
        assert ended.state == "cancelled"
    finally:
        wrapper.kill()
        wrapper.wait()

"""ProcessSupervisor with real child processes: exits, signals, bounded output, restarts."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from afterword.store import RecordStore, StoreOptions
from afterword.tasks import (
    ProcessSupervisor,
    TaskJournal,
    core,
    event_id_for,
    parse_notification,
    procinfo,
    render_notification,
)
from afterword.tasks.render import OutputExcerpt
from afterword.wal import WalOptions

PY = sys.executable
OPTIONS = StoreOptions(wal=WalOptions(segment_size=4 * 1024 * 1024, max_payload=1024 * 1024, zero_fill=False))


@asynccontextmanager
async def supervised(state_dir: str, **kw: object) -> AsyncIterator[tuple[TaskJournal, ProcessSupervisor]]:
    store = RecordStore.open(state_dir, options=OPTIONS)
    try:
        journal = TaskJournal(store)
        kw.setdefault("on_exit", "stop")
        sup = ProcessSupervisor(journal, kill_grace=2.0, poll_interval=0.05, **kw)  # type: ignore[arg-type]
        async with sup:
            yield journal, sup
    finally:
        store.close()


@pytest.mark.anyio
async def test_exit_is_recorded_with_event_id_independently_of_the_tool_call(state_dir: str) -> None:
    async with supervised(state_dir) as (_, sup):
        code = "import sys; print('out'); print('err', file=sys.stderr)"
        task = await sup.start("s1", "call-1", [PY, "-c", code])
        assert task.state == "running" and task.pid is not None and task.process_identity
        done = await sup.wait(task.task_id, timeout=30)
    assert done.state == "exited" and done.exit_code == 0 and done.signal is None
    assert done.event_id == event_id_for(task.task_id)
    assert not done.committed and not done.delivered  # no tool call involved at all
    out = Path(state_dir, done.output_path)
    assert out.read_bytes().split() == [b"out", b"err"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert done.output_bytes == len(out.read_bytes())
    with RecordStore.open(state_dir, options=OPTIONS) as store:  # durable, not just in memory
        assert TaskJournal(store).require(task.task_id) == done


@pytest.mark.anyio
async def test_nonzero_exit_is_failed_and_a_missing_command_fails_to_start(state_dir: str) -> None:
    async with supervised(state_dir) as (_, sup):
        failed = await sup.wait((await sup.start("s1", "c1", [PY, "-c", "raise SystemExit(7)"])).task_id, 30)
        missing = await sup.wait(
            (await sup.start("s1", "c2", ["/nonexistent/definitely-not-here"])).task_id, 30
        )
        no_dir = await sup.start("s1", "c3", ["true"], cwd="/nonexistent/dir")
    assert failed.state == "failed" and failed.exit_code == 7
    assert missing.state == "failed" and missing.exit_code is None  # the wrapper reported it
    assert missing.error and "could not start" in missing.error and "FileNotFoundError" in missing.error
    assert no_dir.state == "failed" and no_dir.pid is None  # not even the wrapper started
    assert no_dir.error and "could not start" in no_dir.error
    assert missing.event_id == event_id_for(missing.task_id)


@pytest.mark.anyio
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_a_child_killed_from_outside_is_killed_with_its_signal(
    state_dir: str, sig: signal.Signals
) -> None:
    async with supervised(state_dir) as (_, sup):
        task = await sup.start("s1", "c1", ["sleep", "60"])
        assert task.pid is not None
        os.kill(task.pid, sig)  # not through the supervisor: an outside actor
        done = await sup.wait(task.task_id, timeout=30)
    assert done.state == "killed" and done.signal == int(sig) and done.exit_code is None
    assert core.signal_name(done.signal) == sig.name
    assert done.event_id is not None


@pytest.mark.anyio
async def test_a_users_cancel_records_cancelled(state_dir: str) -> None:
    async with supervised(state_dir) as (_, sup):
        first = await sup.start("s1", "c1", ["sleep", "60"])
        cancelled = await sup.cancel(first.task_id)
    assert cancelled.state == "cancelled" and cancelled.signal == signal.SIGTERM
    assert "cancelled" in core.blockers(cancelled)


@pytest.mark.anyio
async def test_a_host_shutdown_is_not_a_cancel_stop_is_notified(state_dir: str) -> None:
    """on_exit="stop": the end is recorded as killed with a cause, and stays notifiable."""
    async with supervised(state_dir, on_exit="stop") as (journal, sup):
        task = await sup.start("s1", "c1", ["sleep", "60"])
    ended = journal.require(task.task_id)
    assert ended.state == "killed" and ended.signal == signal.SIGTERM
    assert ended.error == core.HOST_STOPPED and not ended.cancel_requested and ended.stop_requested
    assert "cancelled" not in core.blockers(ended)  # unlike a cancel, the model will be told
    refs = core.handoff_references([ended])
    assert refs == []  # not yet handed off by a tool result; once it is, it needs consumption
    handed = core.commit(core.prepare_commit(ended, tool_result_id="r", reported_terminal=False), now=1.0)
    assert core.eligible(handed) and core.needs_consumption(handed)
    # The notification tells the model why the task ended.
    note = render_notification(
        handed, OutputExcerpt(text="", excerpt_bytes=0, total_bytes=0, truncated=False)
    )
    facts = parse_notification(note).task
    assert facts.state == "killed" and facts.error == core.HOST_STOPPED and facts.signal == "SIGTERM"


@pytest.mark.anyio
async def test_a_host_shutdown_is_not_a_cancel_detach_leaves_it_for_adoption(state_dir: str) -> None:
    """The default: the process keeps running, and the next supervisor adopts it and learns
    its real exit status from the wrapper's record."""
    marker = Path(state_dir).parent / "finished"
    code = f"import time, pathlib; time.sleep(0.5); print('done'); pathlib.Path({str(marker)!r}).touch()"
    async with supervised(state_dir, on_exit="detach") as (journal, sup):
        task = await sup.start("s1", "c1", [PY, "-c", code])
    assert journal.require(task.task_id).state == "running"  # not cancelled by the shutdown
    async with supervised(state_dir) as (journal, sup):
        assert journal.require(task.task_id).adopted
        done = await sup.wait(task.task_id, timeout=30)
    assert done.state == "exited" and done.exit_code == 0 and done.error is None
    assert marker.exists()
    assert Path(state_dir, done.output_path).read_bytes() == b"done\n"


@pytest.mark.anyio
async def test_output_capture_is_bounded_keeping_head_and_tail(state_dir: str) -> None:
    code = "import sys; sys.stdout.write('A' * 100000 + 'B' * 100000 + 'C' * 100000)"
    async with supervised(state_dir, max_output_bytes=64 * 1024) as (_, sup):
        done = await sup.wait((await sup.start("s1", "c1", [PY, "-c", code])).task_id, 30)
    data = Path(state_dir, done.output_path).read_bytes()
    assert done.output_bytes == 300000 and done.output_truncated
    assert data.startswith(b"A" * 32768) and data.endswith(b"C" * 32768)
    assert b"[... 234464 bytes of output omitted ...]" in data
    assert len(data) < 64 * 1024 + 100


@pytest.mark.anyio
async def test_a_task_whose_pid_was_never_recorded_is_lost(state_dir: str) -> None:
    store = RecordStore.open(state_dir, options=OPTIONS)
    try:
        journal = TaskJournal(store)
        # What a crash between "record the task" and "record the pid" leaves behind.
        await journal.create(
            core.new_task(
                task_id="t-orphan",
                session_id="s1",
                tool_call_id="c1",
                command=["true"],
                notify="on_exit",
                cwd=None,
                output_path=journal.output_path("t-orphan"),
                now=time.time(),
            )
        )
        async with ProcessSupervisor(journal):
            pass
        task = journal.require("t-orphan")
    finally:
        store.close()
    assert task.state == "lost" and task.error == core.LOST_NEVER_RECORDED
    assert task.event_id == event_id_for("t-orphan")


# -- restarts: the supervisor process dies (SIGKILL) while its child runs --------------------------
CRASHING_HOST = r"""
import sys
import anyio
from afterword.store import RecordStore, StoreOptions
from afterword.tasks import ProcessSupervisor, TaskJournal
from afterword.wal import WalOptions

OPTIONS = StoreOptions(wal=WalOptions(segment_size=4 * 1024 * 1024, max_payload=1024 * 1024, zero_fill=False))

async def main(state_dir):
    store = RecordStore.open(state_dir, options=OPTIONS)
    async with ProcessSupervisor(TaskJournal(store)) as sup:
        task = await sup.start("s1", "call-1", ["sleep", "120"], task_id="t-restart")
        print("STARTED", task.pid, flush=True)
        await anyio.sleep(3600)

anyio.run(main, sys.argv[1])
"""


@pytest.fixture
def orphaned_child(state_dir: str, tmp_path: Path) -> Iterator[int]:
    """Run a host that starts ``sleep`` and is SIGKILLed; yields the surviving child's pid."""
    script = tmp_path / "host.py"
    script.write_text(CRASHING_HOST)
    host = subprocess.Popen([PY, str(script), state_dir], stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    line = host.stdout.readline()
    host.kill()
    host.wait()
    host.stdout.close()
    assert line.startswith("STARTED"), line
    pid = int(line.split()[1])
    try:
        yield pid
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(pid: int, identity: str | None) -> None:
    deadline = time.monotonic() + 20
    while procinfo.probe(pid, identity) == "alive":
        assert time.monotonic() < deadline, "child did not die"
        time.sleep(0.02)


@pytest.mark.anyio
async def test_restart_with_a_vanished_process_reports_lost(state_dir: str, orphaned_child: int) -> None:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        identity = TaskJournal(store).require("t-restart").process_identity
    os.killpg(orphaned_child, signal.SIGKILL)  # the child vanishes while no supervisor runs
    _wait_gone(orphaned_child, identity)
    async with supervised(state_dir) as (journal, sup):
        task = journal.require("t-restart")
        assert sup.running() == []
    assert task.state == "lost" and task.pid == orphaned_child
    assert task.error == core.LOST_VANISHED and task.exit_code is None and task.signal is None
    assert task.event_id == event_id_for("t-restart")


@pytest.mark.anyio
async def test_restart_adopts_a_live_process_then_reports_lost_when_it_ends(
    state_dir: str, orphaned_child: int
) -> None:
    async with supervised(state_dir) as (journal, sup):
        adopted = journal.require("t-restart")
        assert adopted.state == "running" and adopted.adopted
        assert sup.running() == ["t-restart"]
        os.killpg(orphaned_child, signal.SIGKILL)
        done = await sup.wait("t-restart", timeout=30)
    # Nobody could wait() for it, so the journal does not claim to know how it ended.
    assert done.state == "lost" and done.error == core.LOST_UNSUPERVISED_EXIT
    assert done.signal is None and done.exit_code is None


# -- item 5: a SIGKILLed supervisor takes neither the command nor its capture down ---------------
CHATTY_HOST = r"""
import sys
import anyio
from afterword.store import RecordStore, StoreOptions
from afterword.tasks import ProcessSupervisor, TaskJournal
from afterword.wal import WalOptions

OPTIONS = StoreOptions(wal=WalOptions(segment_size=4 * 1024 * 1024, max_payload=1024 * 1024, zero_fill=False))

async def main(state_dir, marker):
    store = RecordStore.open(state_dir, options=OPTIONS)
    async with ProcessSupervisor(TaskJournal(store)) as sup:
        script = "for i in 1 2 3 4 5 6 7 8; do echo line $i; sleep 0.1; done; touch " + marker
        task = await sup.start("s1", "call-1", ["sh", "-c", script], task_id="t-chatty")
        print("STARTED", task.pid, flush=True)
        await anyio.sleep(3600)

anyio.run(main, sys.argv[1], sys.argv[2])
"""


@pytest.mark.anyio
@pytest.mark.parametrize("restart", ["while_running", "after_it_ended"])
async def test_sigkilled_supervisor_the_command_finishes_and_its_end_is_known(
    state_dir: str, tmp_path: Path, restart: str
) -> None:
    script, marker = tmp_path / "host.py", tmp_path / "finished"
    script.write_text(CHATTY_HOST)
    host = subprocess.Popen([PY, str(script), state_dir, str(marker)], stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None
    line = host.stdout.readline()
    host.send_signal(signal.SIGKILL)  # the supervisor dies mid-run, the command keeps printing
    host.wait()
    host.stdout.close()
    assert line.startswith("STARTED"), line
    wrapper = int(line.split()[1])
    try:
        if restart == "after_it_ended":
            deadline = time.monotonic() + 30
            while not marker.exists():
                assert time.monotonic() < deadline, "the command died with its supervisor"
                time.sleep(0.05)
        async with supervised(state_dir) as (journal, sup):
            if restart == "while_running":
                assert journal.require("t-chatty").adopted
            done = await sup.wait("t-chatty", timeout=30)
    finally:
        try:
            os.killpg(wrapper, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    assert marker.exists()  # no SIGPIPE: the command ran to its end
    # The wrapper's record says how it ended: not lost.
    assert done.state == "exited" and done.exit_code == 0 and done.error is None
    out = Path(state_dir, done.output_path).read_text()
    assert out.splitlines() == [f"line {i}" for i in range(1, 9)]  # all of it, none lost
    assert stat.S_IMODE(Path(state_dir, done.output_path).stat().st_mode) == 0o600
    assert done.output_bytes == len(out) and not done.output_truncated

"""``afterword tasks list|show`` (afterword/cli/tasks.py)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import anyio
import pytest

from afterword.cli import main
from afterword.history import DurableHistory, Message
from afterword.store import RecordStore, StoreOptions
from afterword.tasks import ProcessSupervisor, TaskJournal, TaskNotifications, ToolCallProcessor, core
from afterword.wal import WalOptions

OPTIONS = StoreOptions(wal=WalOptions(segment_size=4 * 1024 * 1024, max_payload=1024 * 1024, zero_fill=False))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "afterword.cli", *args], capture_output=True, text=True, timeout=60
    )


async def _populate(state_dir: str) -> dict[str, str]:
    with RecordStore.open(state_dir, options=OPTIONS) as store:
        journal, history = TaskJournal(store), DurableHistory(store)
        notes, tools = TaskNotifications(journal, history), ToolCallProcessor(journal, history)
        async with ProcessSupervisor(journal) as sup:
            await history.append("s-a", [Message(id="a1", role="assistant", content="", tool_calls=("c1",))])
            ok = await sup.start("s-a", "c1", [sys.executable, "-c", "print('SECRET-LOOKING OUTPUT')"])
            result = Message(id="r1", role="tool", content="bg", tool_call_id="c1")
            await tools.commit_tool_result("s-a", result)
            await sup.wait(ok.task_id, 30)
            await notes.deliver("s-a")
            other = await sup.start("s-b", "c9", [sys.executable, "-c", "raise SystemExit(2)"])
            await sup.wait(other.task_id, 30)
        return {"ok": ok.task_id, "other": other.task_id}


@pytest.fixture
def populated(state_dir: str) -> dict[str, str]:
    return anyio.run(_populate, state_dir)


def test_list_json_and_session_filter(state_dir: str, populated: dict[str, str]) -> None:
    proc = cli("tasks", "list", "--state-dir", state_dir, "--json")
    assert proc.returncode == 0, proc.stderr
    items = json.loads(proc.stdout)["items"]
    assert {i["taskId"] for i in items} == set(populated.values())
    ok = next(i for i in items if i["taskId"] == populated["ok"])
    assert ok["state"] == "exited" and ok["committed"] and ok["delivered"] and not ok["consumed"]
    assert ok["eventId"].startswith("tev_") and ok["notificationBlockers"] == ["already_delivered"]
    only_b = json.loads(cli("tasks", "list", "--state-dir", state_dir, "--session", "s-b", "--json").stdout)
    assert [i["taskId"] for i in only_b["items"]] == [populated["other"]]


def test_list_and_show_text(
    state_dir: str, populated: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tasks", "list", "--state-dir", state_dir]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["TASK", "SESSION", "STATE", "NOTIFY", "FLAGS", "COMMAND"]
    assert any(populated["other"] in row and "failed(2)" in row for row in table)
    assert main(["tasks", "show", populated["other"], "--state-dir", state_dir]) == 0
    shown = capsys.readouterr().out
    assert "notification: not eligible (tool_result_not_committed)" in shown
    assert "SECRET-LOOKING" not in shown  # output only on request
    assert main(["tasks", "show", populated["ok"], "--state-dir", state_dir, "--output"]) == 0
    shown = capsys.readouterr().out
    assert "notification: delivered as task-notification:tev_" in shown
    assert "--- untrusted process output" in shown and "SECRET-LOOKING OUTPUT" in shown


def test_show_json_missing_task_and_missing_journal(
    state_dir: str, populated: dict[str, str], tmp_path: Path
) -> None:
    proc = cli("tasks", "show", populated["ok"], "--state-dir", state_dir, "--json", "--output")
    view = json.loads(proc.stdout)
    assert view["taskId"] == populated["ok"] and "SECRET-LOOKING" in view["untrustedProcessOutput"]["text"]
    missing = cli("tasks", "show", "task_nope", "--state-dir", state_dir)
    assert missing.returncode == 1 and "no task" in missing.stderr
    nowhere = str(tmp_path / "absent")
    absent = cli("tasks", "list", "--state-dir", nowhere, "--json")
    assert absent.returncode == 3 and "does not exist" in absent.stderr and absent.stdout == ""
    assert not os.path.exists(nowhere)  # a viewer creates nothing


def test_the_view_works_while_the_host_owns_the_journal(state_dir: str, populated: dict[str, str]) -> None:
    async def live() -> None:
        with RecordStore.open(state_dir, options=OPTIONS) as store:  # the running host
            journal = TaskJournal(store)
            await journal.update_control("s-a", lambda c: core.interrupted(c, now=c.updated_at + 1))
            await journal.update_control(
                "s-a",
                lambda c: core.turn_finished(
                    c, error="RuntimeError: provider \x1b[2Jdown", max_model_failures=1, now=2.0
                ),
            )
            listing = await anyio.to_thread.run_sync(lambda: cli("tasks", "list", "--state-dir", state_dir))
            shown = await anyio.to_thread.run_sync(
                lambda: cli("tasks", "show", populated["ok"], "--state-dir", state_dir, "--json")
            )
        assert listing.returncode == 0, listing.stderr
        assert populated["ok"] in listing.stdout and populated["other"] in listing.stdout
        assert (
            "session s-a: interrupted,retries-exhausted,model-failures=1 last error: RuntimeError: provider"
            in listing.stdout
        )
        assert "\x1b" not in listing.stdout
        view = json.loads(shown.stdout)
        assert view["session"]["interrupted"] and view["session"]["retriesExhausted"]
        assert view["session"]["goal"] == "none" and "provider" in view["session"]["lastError"]
        assert datetime.fromisoformat(view["createdAt"]).tzinfo is not None  # ISO 8601, UTC

    anyio.run(live)


HOSTILE = (
    "import sys; sys.stdout.write('ok\\n\\x1b[2J\\x1b]0;pwned\\x07--- end of output ---\\n"
    "notification: delivered as forged\\n\\x1b[31mred\\x1b[0m')"
)


def test_show_output_strips_escapes_and_cannot_fake_its_footer(state_dir: str) -> None:
    async def make() -> str:
        with RecordStore.open(state_dir, options=OPTIONS) as store:
            async with ProcessSupervisor(TaskJournal(store)) as sup:
                task = await sup.start("s", "c", [sys.executable, "-c", HOSTILE, "it's"])
                await sup.wait(task.task_id, 30)
                return task.task_id

    task_id = anyio.run(make)
    proc = cli("tasks", "show", task_id, "--state-dir", state_dir, "--output")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert lines[-1] == "--- end of output ---"
    assert lines.count("--- end of output ---") == 1  # the printed one is prefixed, not a frame
    assert "| --- end of output ---" in lines and "| notification: delivered as forged" in lines
    assert "| red" in lines
    command = next(line for line in lines if line.startswith("command: "))
    assert command == "command: " + shlex.join([sys.executable, "-c", HOSTILE, "it's"])  # shell-quoted


def test_a_journal_readable_by_others_says_how_to_fix_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "tasks"
    journal.mkdir(mode=0o755)
    journal.chmod(0o755)
    assert main(["tasks", "list", "--state-dir", str(journal)]) == 3
    err = capsys.readouterr().err
    assert "permissive_mode" in err and "chmod 0700" in err and len(err.strip().splitlines()) == 1


def test_a_missing_verb_is_named_like_the_other_command_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["tasks"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "required: VERB" in err and "tasks_command" not in err

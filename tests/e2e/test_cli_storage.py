"""Issue 14 items 7 and 8 and the doctor: damaged state gets one line from the CLI, startup
recovery's state changes are logged, and ``continuations doctor`` explains damage read-only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _cli import Server, run_cli
from _disk_helpers import snapshot
from _service import DETACHED_TOKEN, write_config
from fakes.harness import make_config, running
from fakes.producer import reply_run

from afterword.cli import main
from afterword.continuations import lifecycle
from afterword.store import Put, RecordStore


def _state_with_records(tmp_path: Path) -> tuple[Path, Path]:
    config = write_config(tmp_path)
    state = tmp_path / "state"
    with RecordStore.open(str(state)) as store:
        for i in range(3):
            store.transact_sync([Put(f"x:{i}", b"v")])
        store.checkpoint_sync()
        store.transact_sync([Put("x:last", b"v")])
    return config, state


class Done:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> Done:
    """The CLI in this process (an exception escaping main() is what prints a traceback)."""
    code = main(list(args))
    out = capsys.readouterr()
    return Done(code, out.out, out.err)


def _one_line_refusal(capsys: pytest.CaptureFixture[str], config: Path, rule: str) -> str:
    done = _cli(capsys, "serve", "--config", str(config))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("afterword: ") and rule in lines[0], done.stderr
    return lines[0]


def test_serve_refuses_a_garbage_owner_db_in_one_line_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, state = _state_with_records(tmp_path)
    (state / "owner.db").write_bytes(os.urandom(8192))
    assert str(state / "owner.db") in _one_line_refusal(capsys, config, "bad_lock_file")
    done = run_cli("serve", config=config)  # the real command line too: no traceback
    assert done.returncode == 1 and "Traceback" not in done.stderr and "bad_lock_file" in done.stderr


def test_serve_refuses_a_damaged_log_segment_in_one_line_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, state = _state_with_records(tmp_path)
    manifest = json.loads((state / "MANIFEST").read_text())
    slot = manifest["segments"][-1][0]
    with open(state / "wal" / f"{slot:08d}.seg", "r+b") as fh:
        fh.write(b"\0" * 64)
    _one_line_refusal(capsys, config, "segment_replaced")


@pytest.fixture(autouse=True)
def _detached_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AFTERWORD_TEST_DETACHED_TOKEN", DETACHED_TOKEN)  # the config names it


@pytest.mark.anyio
async def test_serve_logs_the_state_change_recovery_makes_on_start(tmp_path: Path) -> None:
    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        claimed = await reply_run(h.service, h.producer, {"summary": "x"})
        now = h.service.clock_ms()
        await h.service.transition(claimed.id, lambda r: lifecycle.begin_synthesis(r, now))
    server = Server(tmp_path / "afterword.json")
    server.start()
    try:
        server.http.get(server.base + "/v1/operator/health")
    finally:
        assert server.stop() == 0
    events = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    assert {"id": claimed.id, "from": "synthesizing", "to": "dead_lettered"}.items() <= next(
        e for e in events if e.get("id") == claimed.id
    ).items()


def test_doctor_explains_damage_without_changing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, state = _state_with_records(tmp_path)
    ok = _cli(capsys, "continuations", "doctor", "--config", str(config))
    assert ok.returncode == 0 and "opens cleanly" in ok.stdout and "records 4" in ok.stdout
    # "records" is every key in the store; the note says how many of them are continuations.
    assert "note: records counts every key in the store: 0 continuations, 0 compacted" in ok.stdout
    assert "0 run activations and 4 others" in ok.stdout
    (state / "secret").unlink()
    before = snapshot(str(state))
    bad = _cli(capsys, "continuations", "doctor", "--config", str(config))
    assert bad.returncode == 2, bad.stderr
    assert "DAMAGED" in bad.stdout and "secret_missing" in bad.stdout and "Restore `secret`" in bad.stdout
    assert str(state / "secret") in bad.stdout
    as_json = json.loads(_cli(capsys, "continuations", "doctor", "--json", "--config", str(config)).stdout)
    assert as_json["healthy"] is False and as_json["rule"] == "secret_missing"
    assert snapshot(str(state)) == before


def test_doctor_checks_a_backup_directory_and_reads_beside_a_running_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, state = _state_with_records(tmp_path)
    with RecordStore.open(str(state)) as store:  # the owner holds the lock meanwhile
        store.transact_sync([Put("x:more", b"v")])
        done = _cli(capsys, "continuations", "doctor", "--state-dir", str(state))
        assert done.returncode == 0 and "records 5" in done.stdout, done.stdout + done.stderr
    (state / "wal").rename(tmp_path / "wal-gone")
    done = _cli(capsys, "continuations", "doctor", "--state-dir", str(state))
    assert done.returncode == 2 and "segment_missing" in done.stdout, done.stdout


def test_doctor_on_a_state_dir_below_a_regular_file_names_it_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("not a directory\n")
    below = tmp_path / "file" / "state"
    assert main(["continuations", "doctor", "--state-dir", str(below)]) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert "not_directory" in out.out and "regular file" in out.out
    # Opening it for writing refuses the same way instead of raising NotADirectoryError.
    from afterword.disk import UnsafeStateError

    with pytest.raises(UnsafeStateError) as refused:
        RecordStore.open(str(below))
    assert refused.value.rule == "not_directory"

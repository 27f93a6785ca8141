"""Issue 14 items 7 and 8 and the doctor: damaged state gets one line from the CLI, startup
recovery's state changes are logged, and ``continuations doctor`` explains damage read-only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _cli import Server, run_cli
from _disk_helpers import snapshot
from _service import write_config
from fakes.harness import make_config, running
from fakes.producer import reply_run

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


def _one_line_refusal(config: Path, rule: str) -> None:
    done = run_cli("serve", config=config)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("afterword: ") and rule in lines[0], done.stderr


def test_item7_garbage_owner_db_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    config, state = _state_with_records(tmp_path)
    (state / "owner.db").write_bytes(os.urandom(8192))
    _one_line_refusal(config, "bad_lock_file")
    assert str(state / "owner.db") in run_cli("serve", config=config).stderr


def test_item7_damaged_log_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    config, state = _state_with_records(tmp_path)
    manifest = json.loads((state / "MANIFEST").read_text())
    slot = manifest["segments"][-1][0]
    with open(state / "wal" / f"{slot:08d}.seg", "r+b") as fh:
        fh.write(b"\0" * 64)
    _one_line_refusal(config, "segment_replaced")


@pytest.mark.anyio
async def test_item8_recovery_changes_are_logged_by_serve(tmp_path: Path) -> None:
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


def test_doctor_explains_damage_without_changing_anything(tmp_path: Path) -> None:
    config, state = _state_with_records(tmp_path)
    ok = run_cli("continuations", "doctor", config=config)
    assert ok.returncode == 0 and "opens cleanly" in ok.stdout and "records 4" in ok.stdout
    (state / "secret").unlink()
    before = snapshot(str(state))
    bad = run_cli("continuations", "doctor", config=config)
    assert bad.returncode == 2, bad.stderr
    assert "DAMAGED" in bad.stdout and "secret_missing" in bad.stdout and "Restore `secret`" in bad.stdout
    assert str(state / "secret") in bad.stdout
    as_json = json.loads(run_cli("continuations", "doctor", "--json", config=config).stdout)
    assert as_json["healthy"] is False and as_json["rule"] == "secret_missing"
    assert snapshot(str(state)) == before


def test_doctor_checks_a_backup_directory_and_reads_beside_a_running_owner(tmp_path: Path) -> None:
    _, state = _state_with_records(tmp_path)
    with RecordStore.open(str(state)) as store:  # the owner holds the lock meanwhile
        store.transact_sync([Put("x:more", b"v")])
        done = run_cli("continuations", "doctor", "--state-dir", str(state))
        assert done.returncode == 0 and "records 5" in done.stdout, done.stdout + done.stderr
    (state / "wal").rename(tmp_path / "wal-gone")
    done = run_cli("continuations", "doctor", "--state-dir", str(state))
    assert done.returncode == 2 and "segment_missing" in done.stdout, done.stdout

"""Ownership that one `rm` cannot take away (issue 29, point 2).

Deleting or replacing ``owner.db`` while a host runs used to let a second host open the same
directory; both then wrote the same log and an acknowledged claim was gone after both
stopped. The directory's own ``flock`` keeps the second opener out, and the owner notices its
lock file (or its directory) changed, refuses writes and stops.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import anyio
import pytest
from _cli import FakeWebhook, run_cli, served, write_operator_config
from _disk_helpers import SMALL, populate
from _service import ENV, load, write_config
from test_lock import LOCKED_EXIT, try_open_elsewhere

import afterword
from afterword.cli.doctor import diagnose
from afterword.disk import DiskFailedError, OsDisk, UnsafeStateError
from afterword.store import OwnershipLostError, Put, RecordStore, StoreLockedError, StoreOptions


def test_second_process_is_refused_after_owner_db_is_deleted(state_dir: str) -> None:
    populate(state_dir)
    with RecordStore.open(state_dir, options=SMALL) as store:
        store.transact_sync([Put("acked:1", b"acknowledged by the first owner")])
        os.unlink(os.path.join(state_dir, "owner.db"))
        code, out = try_open_elsewhere(state_dir)
        assert code == LOCKED_EXIT, out
        assert "lock on the directory itself is held" in out
        # In this process too: a fresh owner.db is not a fresh ownership.
        with pytest.raises(StoreLockedError, match="directory itself"):
            RecordStore.open(state_dir, options=SMALL)
    with RecordStore.open(state_dir, options=SMALL) as reopened:
        assert reopened.get("acked:1") is not None


def test_second_process_is_refused_after_owner_db_is_replaced(state_dir: str) -> None:
    populate(state_dir)
    with RecordStore.open(state_dir, options=SMALL):
        owner = os.path.join(state_dir, "owner.db")
        shutil.copyfile(owner, owner + ".copy")
        os.chmod(owner + ".copy", 0o600)
        os.replace(owner + ".copy", owner)
        code, out = try_open_elsewhere(state_dir)
        assert code == LOCKED_EXIT, out


@pytest.mark.parametrize("damage", ["removed", "replaced", "directory_moved"])
def test_owner_notices_and_refuses_writes(state_dir: str, damage: str) -> None:
    populate(state_dir)
    store = RecordStore.open(state_dir, options=SMALL)
    try:
        store.check_ownership()  # nothing changed yet
        owner = os.path.join(state_dir, "owner.db")
        if damage == "removed":
            os.unlink(owner)
        elif damage == "replaced":
            shutil.copyfile(owner, owner + ".copy")
            os.replace(owner + ".copy", owner)
        else:
            os.rename(state_dir, state_dir + ".moved")
            os.mkdir(state_dir, 0o700)
        with pytest.raises(OwnershipLostError, match="ownership lost"):
            store.check_ownership()
        with pytest.raises(DiskFailedError):
            store.transact_sync([Put("after:loss", b"must not be written")])
        problem = store.storage_problem()
        assert problem is not None and problem[0] == "disk_failed" and "ownership lost" in problem[1]
    finally:
        store.close()
    if damage == "directory_moved":
        # The close wrote nothing into the directory that now sits at the old path.
        assert os.listdir(state_dir) == []


def test_a_directory_moved_away_is_not_recreated_empty(state_dir: str) -> None:
    """The owner leaves a file at the path its directory was moved away from: the next start
    (and doctor) refuse it instead of creating a new, empty state directory there."""
    populate(state_dir)
    store = RecordStore.open(state_dir, options=SMALL)
    try:
        os.rename(state_dir, state_dir + ".moved")
        with pytest.raises(OwnershipLostError, match="a file now stands at its path"):
            store.check_ownership()
    finally:
        store.close()
    assert os.path.isfile(state_dir)
    with open(state_dir, "rb") as fh:
        assert b"moved away" in fh.read()
    with pytest.raises(UnsafeStateError) as err:
        RecordStore.open(state_dir, options=SMALL)
    assert err.value.rule == "not_directory" and "a host leaves one" in str(err.value)
    assert not diagnose(state_dir).healthy
    # Moved back, it opens with everything it held.
    os.unlink(state_dir)
    os.rename(state_dir + ".moved", state_dir)
    with RecordStore.open(state_dir, options=SMALL) as reopened:
        assert reopened.get("wal:only") is not None


def test_a_clean_stop_notices_a_moved_directory_too(state_dir: str) -> None:
    populate(state_dir)
    store = RecordStore.open(state_dir, options=SMALL)
    store.transact_sync([Put("k:1", b"v")])
    os.rename(state_dir, state_dir + ".moved")
    store.close()
    assert os.path.isfile(state_dir)


def test_service_stops_when_its_lock_file_is_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tmp_path.chmod(0o700)
    config = load(write_config(tmp_path))
    options = StoreOptions(ownership_check_seconds=0.01)
    reached_forever = []

    async def run() -> None:
        async with afterword.open_service(
            config, environ=ENV, serve_http=False, run_worker=False, store_options=options
        ):
            os.unlink(os.path.join(config.state_dir, "owner.db"))
            reached_forever.append(True)
            await anyio.sleep_forever()  # only the watcher can end this

    with caplog.at_level(logging.ERROR, logger="afterword.service"), pytest.raises(OwnershipLostError):
        anyio.run(run)
    assert reached_forever == [True]
    assert any("ownership lost" in r.getMessage() and "stopping" in r.getMessage() for r in caplog.records)


def test_serve_refuses_a_second_host_and_the_first_exits_non_zero(tmp_path: Path, hook: FakeWebhook) -> None:
    config = write_operator_config(tmp_path, hook.url)
    with served(config) as first:
        claim = first.claim("ok", "task-acked-by-first")
        os.unlink(tmp_path / "state" / "owner.db")
        (tmp_path / "other").mkdir()
        other = write_operator_config(tmp_path / "other", hook.url)
        doc = other.read_text().replace('"stateDir": "state"', f'"stateDir": "{tmp_path / "state"}"')
        other.write_text(doc)
        second = run_cli("serve", config=other)
        assert second.returncode == 1
        assert "owned by another process" in second.stderr and "directory itself" in second.stderr
        # The first host sees its lock file gone within its check interval and stops.
        assert first.proc is not None
        code = first.proc.wait(timeout=30)
        first.proc = None
        assert code == 1
        log = first.log()
        assert "ownership lost" in log and "the lock file was removed" in log
    # Nothing the first host acknowledged was lost.
    with served(config) as again:
        assert again.status(claim)["state"] == "claimed"


def test_an_owner_that_cannot_look_counts_its_ownership_lost(state_dir: str) -> None:
    class Blind(OsDisk):
        blind = False

        def lstat(self, path: str) -> os.stat_result:
            if self.blind and path.endswith("owner.db"):
                raise PermissionError(13, "Permission denied", path)
            return super().lstat(path)

    disk = Blind()
    populate(state_dir)
    with RecordStore.open(state_dir, disk=disk, options=SMALL) as store:
        disk.blind = True
        with pytest.raises(OwnershipLostError, match="cannot check it: Permission denied"):
            store.check_ownership()
        assert store.storage_problem() is not None
        disk.blind = False

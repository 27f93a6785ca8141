"""The ownership lock: one open store per state directory, released by the OS on death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from _disk_helpers import SMALL, populate

from afterword.store import Put, RecordStore, StoreLockedError

LOCKED_EXIT = 3

# The children open with the same small-segment options as the tests (_disk_helpers.SMALL).
_OPTIONS = "StoreOptions(wal=WalOptions(segment_size=8 << 20, max_payload=3 << 20, zero_fill=False))"

# Tries to open the store once; reports the outcome as a marker line and an exit code.
_TRY_OPEN = textwrap.dedent(
    f"""
    import sys
    from afterword.store import RecordStore, StoreLockedError, StoreOptions
    from afterword.wal import WalOptions
    try:
        store = RecordStore.open(sys.argv[1], options={_OPTIONS})
    except StoreLockedError as exc:
        print("LOCKED", exc, flush=True)
        sys.exit({LOCKED_EXIT})
    print("OPENED", len(store), flush=True)
    store.close()
    """
)

# Opens the store, commits one record, says READY, then sits on the lock.
_HOLD_OPEN = textwrap.dedent(
    f"""
    import sys, time
    from afterword.store import Put, RecordStore, StoreOptions
    from afterword.wal import WalOptions
    store = RecordStore.open(sys.argv[1], options={_OPTIONS})
    store.transact_sync([Put("held:by-child", b"acknowledged before the kill")])
    print("READY", flush=True)
    time.sleep(120)
    """
)


def try_open_elsewhere(state: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _TRY_OPEN, state], capture_output=True, text=True, timeout=60
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_second_process_is_refused(state_dir: str) -> None:
    populate(state_dir)
    with RecordStore.open(state_dir, options=SMALL):
        code, out = try_open_elsewhere(state_dir)
        assert code == LOCKED_EXIT and out.startswith("LOCKED"), out
    code, out = try_open_elsewhere(state_dir)  # and the lock is gone once we close
    assert code == 0 and out.startswith("OPENED 4"), out


def test_same_process_second_open_is_refused_and_keeps_the_lock(state_dir: str) -> None:
    populate(state_dir)
    with RecordStore.open(state_dir, options=SMALL) as store:
        with pytest.raises(StoreLockedError):
            RecordStore.open(state_dir, options=SMALL)
        # The refused attempt must not have weakened the first owner's lock: closing any
        # descriptor of the lock file drops this process's POSIX locks on it.
        code, out = try_open_elsewhere(state_dir)
        assert code == LOCKED_EXIT, out
        with pytest.raises(StoreLockedError):
            RecordStore.open(state_dir, options=SMALL)
        store.transact_sync([Put("still:mine", b"yes")])
    with RecordStore.open(state_dir, options=SMALL) as store:  # released by close()
        assert store.get("still:mine") is not None


def test_same_process_open_through_another_path_is_refused(state_dir: str) -> None:
    populate(state_dir)
    other_spelling = os.path.join(state_dir, "..", os.path.basename(state_dir))
    with RecordStore.open(state_dir, options=SMALL), pytest.raises(StoreLockedError):
        RecordStore.open(other_spelling, options=SMALL)


def test_lock_released_when_holder_is_killed(state_dir: str) -> None:
    populate(state_dir)
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD_OPEN, state_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "READY", line + (child.stderr.read() if child.poll() is not None else "")
        with pytest.raises(StoreLockedError):
            RecordStore.open(state_dir, options=SMALL)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    # No stale pid file to clean: the kernel dropped the lock with the process.
    with RecordStore.open(state_dir, options=SMALL) as store:
        rec = store.get("held:by-child")
        assert rec is not None and rec.value == b"acknowledged before the kill"


# An older build's ownership lock: SQLite's exclusive transaction on owner.db, nothing else.
_SQLITE_HOLD = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    conn.execute("PRAGMA journal_mode=MEMORY")
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("CREATE TABLE IF NOT EXISTS owner (pid INTEGER NOT NULL)")
    conn.execute("COMMIT")
    print("READY", flush=True)
    time.sleep(120)
    """
)

_SQLITE_TRY = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
    except sqlite3.OperationalError as exc:
        print("BUSY", exc, flush=True)
    else:
        print("GOT IT", flush=True)
    """
)


def test_the_sqlite_lock_is_taken_as_an_older_build_would_see_it(state_dir: str) -> None:
    """Taken through the disk seam now, not through SQLite: an older build's ``BEGIN
    EXCLUSIVE`` on owner.db must still find it held while a store is open, and free after."""
    populate(state_dir)
    owner_db = os.path.join(state_dir, "owner.db")
    with RecordStore.open(state_dir, options=SMALL):
        out = subprocess.run(
            [sys.executable, "-c", _SQLITE_TRY, owner_db], capture_output=True, text=True, timeout=60
        )
        assert out.stdout.startswith("BUSY"), out.stdout + out.stderr
    out = subprocess.run(
        [sys.executable, "-c", _SQLITE_TRY, owner_db], capture_output=True, text=True, timeout=60
    )
    assert out.stdout.startswith("GOT IT"), out.stdout + out.stderr


def test_an_older_builds_sqlite_lock_refuses_the_open(state_dir: str) -> None:
    populate(state_dir)
    owner_db = os.path.join(state_dir, "owner.db")
    child = subprocess.Popen(
        [sys.executable, "-c", _SQLITE_HOLD, owner_db], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().startswith("READY")
        with pytest.raises(StoreLockedError, match="SQLite lock"):
            RecordStore.open(state_dir, options=SMALL)
    finally:
        child.kill()
        child.wait()
    RecordStore.open(state_dir, options=SMALL).close()  # free again once that holder is gone

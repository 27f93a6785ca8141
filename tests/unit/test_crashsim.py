"""The crash simulator (tools/crashsim): its log, its persistence models, that its checkers
catch broken systems, and a bounded sample of every built-in workload and model (CI).

The full exhaustive run is ``python -m tools.crashsim run --exhaustive --all-faults --seeds 0-9``
(see docs/crash-testing.md).
"""

from __future__ import annotations

import os
import struct
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tools/ is a top-level folder, not part of the installed package
    sys.path.insert(0, str(ROOT))

from afterword.disk import Disk, DiskError, FileHandle, OsDisk, StateRoot  # noqa: E402
from afterword.store import StoreOptions  # noqa: E402
from afterword.wal import committer, scan_chain  # noqa: E402
from afterword.wal.committer import Committer  # noqa: E402
from afterword.wal.scan import SegmentImage  # noqa: E402
from tools.crashsim import (  # noqa: E402
    PROCESS,
    REORDER,
    TORN,
    CrashState,
    Explorer,
    FaultPlan,
    Journal,
    Recorder,
    Scratch,
    Settings,
    StateSpace,
    Workload,
    explore,
    get_workload,
    run_fault,
    run_faults,
)
from tools.crashsim.__main__ import main  # noqa: E402
from tools.crashsim.model import TORN_SECTOR, pieces, torn_variants  # noqa: E402
from tools.crashsim.recorder import (  # noqa: E402
    BaseFile,
    Baseline,
    Create,
    Mark,
    Recording,
    Rename,
    Sync,
    SyncDir,
    Write,
    decode_recording,
    encode_recording,
)
from tools.crashsim.report import render  # noqa: E402
from tools.crashsim.runner import record  # noqa: E402


@pytest.fixture
def scratch() -> Iterator[Scratch]:
    """Scratch space on tmpfs when the machine has one: thousands of tiny fsynced trees."""
    with Scratch() as s:
        yield s


def _walk(base: str) -> tuple[tuple[str, ...], tuple[tuple[str, bytes], ...]]:
    dirs, files = [], []
    for dirpath, dirnames, filenames in os.walk(base):
        dirs += [os.path.relpath(os.path.join(dirpath, d), base) for d in dirnames]
        for name in filenames:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as fh:
                files.append((os.path.relpath(full, base), fh.read()))
    return tuple(sorted(dirs)), tuple(sorted(files))


# -- the recorder and the state builder -------------------------------------------------------
def test_recorder_log_rebuilds_the_real_tree(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    base = str(tmp_path)
    recorder = Recorder(base)
    root = StateRoot(str(tmp_path / "state"), recorder)
    root.ensure_dir("d/e")
    root.write_atomic("d/one", b"first")
    root.write_atomic("d/one", b"second, longer")  # replace
    root.write_atomic("two", b"x" * 1500)
    handle = root.open_file("d/e/grow", writable=True, create=True)
    root.pwrite(handle, b"abc", 0)
    root.truncate(handle, 700)
    root.pwrite(handle, b"tail", 1000)
    root.fdatasync(handle)
    root.close(handle)
    root.remove("two")
    recorder.mark("ack", 1)

    recording = recorder.recording()
    kinds = {type(e).__name__ for e in recording.entries}
    assert {"Mkdir", "Create", "Write", "Sync", "Rename", "SyncDir", "Truncate", "Unlink", "Mark"} <= kinds
    space = StateSpace(recording, PROCESS)
    # Every operation issued and kept: exactly what the real file system holds now.
    tree = space.build(CrashState(space.n), seed=0)
    assert (tree.dirs, tree.files) == _walk(base)
    # The log survives encoding (reports can carry it).
    assert decode_recording(encode_recording(recording)) == recording


def _atomic_replace_log() -> Recording:
    """old file 'f' (ino 1) replaced through a temp: create, write, fsync, rename, dir fsync."""
    baseline = Baseline(dirs=("",), files=(BaseFile("f", 1, b"old"),))
    entries = (
        Mark("begin", 1),
        Create("", ".f.tmp-1-0", 2),
        Write(2, 0, b"new"),
        Sync(2, False),
        Rename("", ".f.tmp-1-0", "", "f", 2),
        SyncDir(""),
        Mark("ack", 1),
    )
    return Recording(baseline, entries)


def test_coverage_and_reorder_states_of_an_atomic_replace() -> None:
    space = StateSpace(_atomic_replace_log(), REORDER)
    assert [space.unsynced(p) for p in range(space.n + 1)] == [(), (0,), (0, 1), (0,), (0, 3), ()]
    assert space.bounds(0) == (0, 0) and space.bounds(1) == (0, 1) and space.bounds(5) == (1, 1)
    contents = set()
    for state in space.enumerate():
        files = dict(space.build(state, seed=0).files)
        contents.add(files.get("f"))
        # The temp's bytes are synced before the rename, so 'f' is whole: old or new.
        assert files.get("f") in (b"old", b"new")
        if state.point == space.n:
            assert files == {"f": b"new"}
    assert contents == {b"old", b"new"}
    # process crashes keep everything issued: one state per point
    assert len(list(StateSpace(_atomic_replace_log(), PROCESS).enumerate())) == space.n + 1


def test_torn_writes_stay_inside_the_written_bytes() -> None:
    assert pieces(300, 700) == [(300, 512), (512, 1000)]
    assert "ZN" in torn_variants(2) and "NO" in torn_variants(2) and "G" in torn_variants(1)
    base = Baseline(dirs=("",), files=(BaseFile("f", 1, b"A" * 1024),))
    rec = Recording(base, (Write(1, 300, b"B" * 700),))
    for model, outside_intact in ((TORN, True), (TORN_SECTOR, False)):
        space = StateSpace(rec, model)
        states = list(space.enumerate())
        assert len(states) == 1 + 2 + len(torn_variants(2))  # before the write, then its fates
        damaged_outside = False
        for state in states:
            data = dict(space.build(state, seed=7).files)["f"]
            assert len(data) == 1024
            damaged_outside |= data[:300] != b"A" * 300 or data[1000:] != b"A" * 24
        assert damaged_outside is not outside_intact
    # garbage is a function of (seed, state): rebuilding gives the same bytes
    space = StateSpace(rec, TORN)
    garbage = [
        s for s in space.enumerate() if s.choice and "G" in TORN.describe(space.ops[0], s.choice[0][1])
    ]
    assert garbage and space.build(garbage[0], seed=1) == space.build(garbage[0], seed=1)
    assert space.build(garbage[0], seed=1) != space.build(garbage[0], seed=2)


def test_state_ids_round_trip_and_are_validated() -> None:
    space = StateSpace(_atomic_replace_log(), REORDER)
    for state in space.enumerate():
        assert CrashState.parse(state.ident) == state
        space.check(state)
    with pytest.raises(ValueError):
        space.check(CrashState.parse("5/0=1"))  # op 0 is covered at the last point
    with pytest.raises(ValueError):
        space.check(CrashState.parse("2/1=7"))


def test_recordings_are_deterministic(scratch: Scratch) -> None:
    for name in ("store-tx", "checkpoint", "blobs"):
        cls = get_workload(name)
        first = record(cls(seed=3, ops=6), scratch).fingerprint()
        assert record(cls(seed=3, ops=6), scratch).fingerprint() == first
        assert record(cls(seed=4, ops=6), scratch).fingerprint() != first or name == "store-tx"


# -- the checkers catch broken systems ------------------------------------------------------------
_REC = struct.Struct("<QQ")
_MAGIC = 0x5EED_F00D_CAFE_D00D


class ToyLog(Workload):
    """A minimal system for the plugin interface: fixed-size records appended to one file.

    Class flags break it on purpose: ``skip_sync`` acknowledges before anything is durable,
    ``swallow_errors`` acknowledges although the fdatasync failed.
    """

    name = "toy-log"
    summary = "append-only log of fixed-size records"
    default_ops = 4
    skip_sync = False
    swallow_errors = False

    def _open(self, state_dir: str, disk: Disk) -> tuple[StateRoot, FileHandle]:
        root = StateRoot(state_dir, disk)
        handle = root.open_file("log", writable=True, create=True)
        root.fsync(handle)
        root.sync_dir("")
        return root, handle

    def run(self, state_dir: str, disk: Disk, journal: Journal) -> None:
        opened = journal.side("open", lambda: self._open(state_dir, disk))
        if opened is None:  # only under injected faults: nothing can be attempted
            for op in range(1, self.ops + 1):
                journal.fail(op, None, refused=True)
            return
        root, handle = opened
        offset = 0
        for op in range(1, self.ops + 1):

            def append(op: int = op, at: int = offset) -> None:
                root.pwrite(handle, _REC.pack(op, op ^ _MAGIC), at)
                if self.skip_sync:
                    return
                try:
                    root.fdatasync(handle)
                except DiskError:
                    if not self.swallow_errors:
                        raise

            journal.attempt(op, append, poisoned=lambda: root.failed is not None)
            if journal.outcomes.get(op) == "acked":
                offset += _REC.size
                if op == 1:
                    journal.fact("first", "present")
        root.close(handle)

    def expect(self, committed: Sequence[int]) -> Mapping[str, tuple[int, ...]]:
        return {"ops": tuple(committed)}

    def recover(self, state_dir: str, disk: Disk) -> Mapping[str, tuple[int, ...]]:
        root = StateRoot(state_dir, disk)
        if not root.exists("log"):
            return {"ops": ()}
        data = root.read_file("log", max_size=1 << 20)
        ops: list[int] = []
        for at in range(0, len(data) - _REC.size + 1, _REC.size):
            op, check = _REC.unpack_from(data, at)
            if check != op ^ _MAGIC or op != len(ops) + 1:
                break
            ops.append(op)
        return {"ops": tuple(ops)}

    def facts(self, state_dir: str) -> Mapping[str, str]:
        return {"first": "present" if self.recover(state_dir, OsDisk())["ops"][:1] == (1,) else "absent"}


class UnsyncedToyLog(ToyLog):
    skip_sync = True


class CarelessToyLog(ToyLog):
    swallow_errors = True


def test_a_correct_plugin_workload_passes(scratch: Scratch) -> None:
    for model in (PROCESS, REORDER, TORN):
        result = explore(ToyLog(seed=0), model, Settings(budget=None), scratch)
        assert result.exhaustive and result.states > 10
        assert result.violations == [], result.violations
    faults = run_faults(ToyLog(seed=0), Settings(fault_budget=None), scratch)
    assert faults.exhaustive and faults.injected > 0 and faults.violations == []


def test_acknowledging_before_fsync_is_caught(scratch: Scratch) -> None:
    result = explore(UnsyncedToyLog(seed=0), REORDER, Settings(budget=None), scratch)
    lost = [v for v in result.violations if v.checker == "acknowledged-lost"]
    assert lost, "dropping unsynced appends must lose an acknowledged op"
    assert "but ops up to" in lost[0].detail and lost[0].seed == 0
    assert "--state" in lost[0].reproduce()
    changed = [v for v in result.violations if v.checker == "fact-changed"]
    assert changed and "first was present, recovered absent" in changed[0].detail
    # the process model keeps everything issued, so it cannot see this bug
    assert explore(UnsyncedToyLog(seed=0), PROCESS, Settings(budget=None), scratch).violations == []


def test_acknowledging_after_a_failed_fsync_is_caught(scratch: Scratch) -> None:
    fired, violations = run_fault(
        CarelessToyLog(seed=0), FaultPlan.parse("fsync#3:EIO:once"), Settings(), scratch
    )
    assert fired
    assert [v.checker for v in violations] == ["ack-after-failure"]
    assert "fsync#3:EIO:once" in violations[0].detail
    fired, clean = run_fault(ToyLog(seed=0), FaultPlan.parse("fsync#3:EIO:once"), Settings(), scratch)
    assert fired and clean == []


def test_fault_plans_parse_and_count() -> None:
    plan = FaultPlan.parse("dirsync#2:ENOSPC:persistent")
    assert (plan.kind, plan.nth, plan.errno, plan.persistent) == ("dirsync", 2, "ENOSPC", True)
    assert FaultPlan.parse(plan.ident) == plan
    for bad in ("fsync#0:EIO:once", "flush#1:EIO:once", "fsync#1:EPERM:once", "fsync"):
        with pytest.raises(ValueError):
            FaultPlan.parse(bad)


# -- the durability layer ---------------------------------------------------------------------
def test_segment_past_the_end_is_recycled_without_a_seq_gap(scratch: Scratch) -> None:
    """Regression: recovery freed a segment whose header survived while the write before it
    was lost, but kept counting its seq, so the next segment left a gap in the chain and the
    following open failed with WalCorruptError (found by this simulator, store-tx seed 0,
    reorder model, state 35/29=1)."""
    workload = get_workload("store-tx")(seed=0)
    explorer = Explorer(workload, REORDER, Settings(budget=None, recovery_budget=4), scratch)
    freed = 0
    for state in explorer.space.enumerate():
        wal = explorer.space.build(state, 0).under("state/wal")
        images = [SegmentImage(int(n[:8]), d) for n, d in wal.items() if n.endswith(".seg")]
        plan = scan_chain(images, start_seq=1, checkpoint_lsn=0, max_payload=workload.options.wal.max_payload)
        freed += bool(plan.free_slots)
    assert freed, "the workload no longer produces a segment past the end; the regression is untested"
    result = explorer.run()
    assert result.violations == [], result.violations


STORE_WORKLOADS = ("store-tx", "checkpoint", "blobs")


def test_the_store_and_service_workloads_run_the_shipped_configuration() -> None:
    """Only the sizes differ from the defaults (tiny segments, no zero fill, one checkpoint
    thread): the one commit path, with the inline bound that ships."""
    shipped = StoreOptions()
    for name in (*STORE_WORKLOADS, "lifecycle", "lifecycle-local", "lifecycle-outbox"):
        options = get_workload(name)(seed=0).options
        wal = options.wal
        assert wal.inline_commit_max_s == shipped.wal.inline_commit_max_s
        sized = replace(
            shipped.wal,
            segment_size=wal.segment_size,
            max_payload=wal.max_payload,
            max_log_bytes=wal.max_log_bytes,
        )
        assert wal == replace(sized, zero_fill=False)
        assert replace(options, wal=shipped.wal, checkpoint_threads=shipped.checkpoint_threads) == shipped


@pytest.mark.slow
def test_bounded_sample_of_every_workload_and_model(scratch: Scratch) -> None:
    """What CI runs: every built-in workload under every default model and a sample of
    injected I/O errors, each bounded; no violation may appear."""
    settings = Settings(budget=300, recovery_budget=8, fault_budget=24)
    models, faults = [], []
    for name in STORE_WORKLOADS:
        workload = get_workload(name)(seed=1)
        for model in (PROCESS, REORDER, TORN):
            models.append(explore(workload, model, settings, scratch))
        faults.append(run_faults(workload, settings, scratch))
    report = render(models, faults, seconds=0.0)
    print(report)
    assert all(r.states > 0 for r in models) and all(r.injected > 0 for r in faults)
    assert sum(r.recovery_states for r in models) > 0
    assert not [v for r in models for v in r.violations] + [v for r in faults for v in r.violations], report


@pytest.fixture
def inline_ack_before_fdatasync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted mutant, in the shipped commit path: a lone commit written inline on the
    event loop is acknowledged without its fdatasync (left to whichever later write syncs the
    segment). Everything else, the threaded batches included, is as shipped."""
    real_write_inline, real_fdatasync = Committer.write_inline, StateRoot.fdatasync
    inline = [False]

    def write_inline(self: Committer, items: committer.Items) -> bool:
        inline[0] = True
        try:
            return real_write_inline(self, items)
        finally:
            inline[0] = False

    def fdatasync(self: StateRoot, handle: FileHandle) -> None:
        if not inline[0]:
            real_fdatasync(self, handle)

    monkeypatch.setattr(Committer, "write_inline", write_inline)
    monkeypatch.setattr(StateRoot, "fdatasync", fdatasync)


@pytest.fixture
def off_loop_ack_before_fdatasync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The other half of the one commit path planted the same way: a batch written in the
    worker thread (several commits, or a new segment life) is acknowledged without the
    fdatasync of its frames. Inline commits are as shipped."""
    real_timed, real_fdatasync = Committer._timed, StateRoot.fdatasync
    off_loop = threading.local()

    async def write_off_loop(self: Committer, items: committer.Items) -> None:
        def run() -> None:
            off_loop.on = True
            try:
                real_timed(self, items)
            finally:
                off_loop.on = False

        await anyio.to_thread.run_sync(run)

    def fdatasync(self: StateRoot, handle: FileHandle) -> None:
        if not (getattr(off_loop, "on", False) and handle.path.endswith(".seg")):
            real_fdatasync(self, handle)

    monkeypatch.setattr(Committer, "write_off_loop", write_off_loop)
    monkeypatch.setattr(StateRoot, "fdatasync", fdatasync)


@pytest.mark.usefixtures("off_loop_ack_before_fdatasync")
def test_acknowledging_an_off_loop_batch_before_its_fdatasync_is_caught(scratch: Scratch) -> None:
    workload = get_workload("store-tx")(seed=1)
    result = explore(workload, REORDER, Settings(budget=None, recovery_budget=0, probe=False), scratch)
    # The acknowledged frames a crash lost sit below the HIGHWATER mark, so the open refuses
    # the state (fail closed) instead of serving it short: reported as a failed recovery.
    caught = [v for v in result.violations if v.checker in ("acknowledged-lost", "recovery-failed")]
    assert caught, "an acknowledged batch written off the loop, lost by a crash, went unnoticed"
    assert "--state" in caught[0].reproduce()


@pytest.mark.parametrize("name", ["store-tx", "lifecycle"])
@pytest.mark.usefixtures("inline_ack_before_fdatasync")
def test_acknowledging_an_inline_commit_before_its_fdatasync_is_caught(name: str, scratch: Scratch) -> None:
    workload = get_workload(name)(seed=1)
    result = explore(workload, REORDER, Settings(budget=120, recovery_budget=0, probe=False), scratch)
    lost = [v for v in result.violations if v.checker == "acknowledged-lost"]
    assert lost, f"{name}: an acknowledged inline commit lost by a crash went unnoticed"
    assert "--state" in lost[0].reproduce()


@pytest.mark.slow
def test_the_crashsim_cli_lists_runs_replays_one_state_and_refuses_an_unknown_workload(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    os.chmod(tmp_path, 0o700)
    assert main(["list"]) == 0
    assert "checkpoint" in capsys.readouterr().out
    args = ["run", "--workload", "blobs", "--model", "reorder", "--budget", "20", "--fault-budget", "2"]
    json_path = tmp_path / "out.json"
    assert main([*args, "--workdir", str(tmp_path / "w"), "--json", str(json_path)]) == 0
    out = capsys.readouterr().out
    assert "blobs" in out and "0 violations" in out and json_path.stat().st_size > 0
    assert main(["state", "--workload", "blobs", "--model", "torn", "--seed", "0", "--state", "0"]) == 0
    assert main(["run", "--workload", "no-such"]) == 2


@pytest.mark.parametrize("name", ["no_such_module_here:Workload", "tools.crashsim.workloads:NoSuchClass"])
def test_a_workload_that_cannot_be_loaded_is_one_line(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="cannot load workload"):
        get_workload(name)
    assert main(["run", "--workload", name]) == 2
    err = capsys.readouterr().err
    assert "cannot load workload" in err and "Traceback" not in err


def test_a_damage_case_id_that_matches_nothing_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["damage", "--workload", "blobs", "--case", "no-such-case"]) == 2
    assert "no damage case 'no-such-case'" in capsys.readouterr().err


@pytest.mark.parametrize("ident", ["bogus", "3/x=1", "3/1"])
def test_a_malformed_state_id_names_itself_and_its_form(ident: str) -> None:
    with pytest.raises(ValueError, match=r"bad crash state id .*expected N or N/I=O"):
        CrashState.parse(ident)

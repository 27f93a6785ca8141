"""The crashsim ``damage`` family (issue 14): every damaged state fails closed or opens exactly.

The default run is exhaustive for seed 0 of the three store workloads (a few seconds);
``CRASHSIM_DAMAGE_SEEDS=0-9`` widens it.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator

import pytest

from afterword.disk import FileHandle
from afterword.disk.root import CheckedRoot
from afterword.store import evidence
from afterword.store import ownership as store_lock
from afterword.store import recovery as store_recovery
from afterword.wal import recovery as wal_recovery
from afterword.wal import scan as wal_scan
from tools.crashsim.__main__ import _seeds, main
from tools.crashsim.damage import DAMAGE_WORKLOADS, DIRECTORY_KINDS, KINDS, run_damage
from tools.crashsim.rollback import ROLLBACK_KINDS
from tools.crashsim.runner import Scratch
from tools.crashsim.workloads import get_workload

SEEDS = _seeds(os.environ.get("CRASHSIM_DAMAGE_SEEDS", "0"))


@pytest.fixture
def scratch() -> Iterator[Scratch]:
    with Scratch() as s:
        yield s


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", DAMAGE_WORKLOADS)
def test_damage_fails_closed_or_opens_exactly(name: str, seed: int, scratch: Scratch) -> None:
    result = run_damage(get_workload(name)(seed=seed), scratch)
    assert result.examples == [] and result.violations == 0
    assert result.total("silent_loss") == 0
    assert result.cases == result.space  # exhaustive
    assert result.total("fail_closed") > result.snapshots
    for kind in KINDS:
        if kind != "manifest-rollback":
            assert sum(result.counts[kind].values()) > 0, kind
    if name == "checkpoint":  # MANIFEST versions to roll back to exist only with checkpoints
        assert result.counts["manifest-rollback"]["fail_closed"] > 0
    # A flipped bit in the last frame is repaired from its write's shadow: never refused.
    flips = result.counts["tail_bitflip"]
    assert flips["exact"] == sum(flips.values()) >= result.snapshots


def test_the_family_catches_a_store_without_evidence(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the evidence checks switched off the same cases open with acknowledged work gone."""
    monkeypatch.setattr(wal_recovery, "check_named", lambda *a, **k: None)
    monkeypatch.setattr(wal_recovery, "check_acked", lambda *a, **k: None)
    monkeypatch.setattr(wal_recovery, "check_mark", lambda *a, **k: None)
    monkeypatch.setattr(evidence.ReplayCheck, "finish", lambda self, actual: None)
    result = run_damage(get_workload("checkpoint")(seed=0), scratch, budget=30)
    assert result.total("silent_loss") > 0
    assert any("silent_loss" in e for e in result.examples)


def test_tail_bitflips_are_silent_losses_without_shadows(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the shadow restore a flipped bit in the last frame reads as a torn write and
    is cut: the kind is known to be able to find that loss. (The HIGHWATER mark refuses
    that cut too, so it is switched off here as well.)"""
    monkeypatch.setattr(wal_scan, "find_shadow", lambda *a, **k: None)
    monkeypatch.setattr(wal_recovery, "check_mark", lambda *a, **k: None)
    result = run_damage(get_workload("store-tx")(seed=0), scratch)
    assert result.counts["tail_bitflip"]["silent_loss"] > 0


# -- issue 29: a segment rolled back, or its last writes zeroed, after a kill ---------------

ROLLBACK_SEEDS = _seeds(os.environ.get("CRASHSIM_ROLLBACK_SEEDS", "0-4"))


@pytest.mark.parametrize("seed", ROLLBACK_SEEDS)
@pytest.mark.parametrize("name", DAMAGE_WORKLOADS)
def test_rolled_back_or_zeroed_logs_fail_closed(name: str, seed: int, scratch: Scratch) -> None:
    result = run_damage(get_workload(name)(seed=seed), scratch, kinds=ROLLBACK_KINDS)
    assert result.examples == [] and result.violations == 0
    assert result.total("silent_loss") == 0
    for kind in ROLLBACK_KINDS:
        assert result.counts[kind]["fail_closed"] > 0, kind


def test_the_family_catches_a_log_that_ignores_its_mark(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutant for ``segment-rollback``: an open that reads the HIGHWATER mark but does not
    hold the log to it opens an older copy of a segment as less."""
    monkeypatch.setattr(wal_recovery, "check_mark", lambda *a, **k: None)
    result = run_damage(get_workload("store-tx")(seed=0), scratch, kinds=("segment-rollback",))
    assert result.counts["segment-rollback"]["silent_loss"] > 0


def test_the_family_catches_a_log_that_never_marks(scratch: Scratch, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant for ``tail-zeroed``: a log whose writes leave the mark where the open put it
    (nothing marks the writes since) opens with its zeroed last writes cut as torn ones."""
    from afterword.wal.highwater import HighWater  # here: the module collects on older builds

    monkeypatch.setattr(HighWater, "record", lambda self, lsn, check: None)
    result = run_damage(get_workload("store-tx")(seed=0), scratch, kinds=("tail-zeroed",))
    assert result.counts["tail-zeroed"]["silent_loss"] > 0


def test_cli_reports_counts_and_replays_one_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["damage", "--workload", "store-tx", "--budget", "3"]) == 0
    out = capsys.readouterr().out
    assert "silent_loss" in out and "0 silent losses" in out
    assert main(["damage", "--workload", "store-tx", "--case", "2:delete:secret"]) == 0
    assert "1 damage cases: 1 failed closed" in capsys.readouterr().out


def test_the_cli_leaves_logging_as_it_found_it() -> None:
    """``main(["damage", ...])`` quiets the refusals it provokes, and must not leave the
    process's logging disabled (later tests of the same session read their warnings)."""
    logging.disable(logging.NOTSET)
    assert main(["damage", "--workload", "store-tx", "--case", "2:delete:secret"]) == 0
    assert logging.getLogger("afterword").isEnabledFor(logging.WARNING)


# -- damage to the directory as a whole (issue 29: emptied, lock deleted, guard replaced) ----


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", DAMAGE_WORKLOADS)
def test_directory_damage_fails_closed(name: str, seed: int, scratch: Scratch) -> None:
    result = run_damage(get_workload(name)(seed=seed), scratch, kinds=DIRECTORY_KINDS)
    assert result.examples == [] and result.violations == 0
    assert result.total("silent_loss") == 0
    for kind in DIRECTORY_KINDS:
        counts = result.counts[kind]
        assert counts["fail_closed"] == sum(counts.values()) >= result.snapshots, kind


def _mutant_outcomes(scratch: Scratch, kind: str) -> Counter[str]:
    result = run_damage(get_workload("checkpoint")(seed=0), scratch, kinds=(kind,))
    return result.counts[kind]


@pytest.mark.parametrize("kind", ["emptied-log", "emptied"])
def test_emptied_directories_are_silent_losses_without_use_evidence(
    kind: str, scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_recovery, "refuse_if_used", lambda root: None)
    assert _mutant_outcomes(scratch, kind)["silent_loss"] > 0


def test_a_second_owner_loses_acknowledged_work_without_the_directory_lock(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    def open_without_flock(self: CheckedRoot) -> FileHandle:
        fd = self._open_dir_fd("")
        st = self.disk.fstat(fd)
        return FileHandle(fd=fd, path=self.root, dev=st.st_dev, ino=st.st_ino)

    monkeypatch.setattr(CheckedRoot, "lock_root", open_without_flock)
    assert _mutant_outcomes(scratch, "lock-deleted")["silent_loss"] > 0


def test_an_owner_that_never_rechecks_its_lock_file_is_caught(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_lock.OwnershipLock, "check", lambda self: None)
    outcomes = _mutant_outcomes(scratch, "lock-deleted")
    assert outcomes["unsafe_open"] == sum(outcomes.values()) > 0


def test_a_replaced_guard_is_caught_without_its_file_rules(
    scratch: Scratch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_recovery, "check_guard_file", lambda root: False)
    outcomes = _mutant_outcomes(scratch, "guard-replaced")
    assert outcomes["unsafe_open"] == sum(outcomes.values()) > 0

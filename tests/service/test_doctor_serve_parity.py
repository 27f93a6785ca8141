"""doctor and serve give one verdict on every damaged state directory (issue 29, points 4, 5).

A state the service wrote (a claim, its rollback guard, an accepted result with its payload
out of line and an origin snapshot blob) is damaged one way per case, then judged by
``continuations doctor`` (read-only) and by the service's open. Both must refuse with the
same rule and path, or both open. Before, a payload at 0644 or a guard deleted beside v3
records passed doctor and failed serve, and a guard that was a symlink, a directory, 0644,
hard-linked or foreign-owned passed both.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from _service import ENV
from fakes.harness import make_config, running
from fakes.producer import reply_run

import afterword
from afterword.cli.doctor import diagnose
from afterword.disk import DiskError
from afterword.legacy.formats import MigrationError
from afterword.store import StoreError
from afterword.wal import WalError

DETAIL = "x" * (40 * 1024)  # out of line: above the 16 KiB inline limit
Damage = Callable[[Path], None]


def _only(state: Path, sub: str) -> Path:
    names = [n for n in os.listdir(state / sub) if not n.startswith(".")]
    assert len(names) == 1, names
    return state / sub / names[0]


def _payload(state: Path) -> Path:
    return _only(state, "payloads")  # the second result is inline


def _blob(state: Path) -> Path:
    return sorted((state / "blobs").iterdir())[0]


def _guard(state: Path) -> Path:
    return state / "records-v2" / "ROLLBACK-GUARD"


def _chmod(which: Callable[[Path], Path], mode: int) -> Damage:
    return lambda state: os.chmod(which(state), mode)


def _symlink_to_copy(which: Callable[[Path], Path]) -> Damage:
    def damage(state: Path) -> None:
        target = which(state)
        aside = state.parent / (target.name + ".aside")
        shutil.copy2(target, aside)
        target.unlink()
        target.symlink_to(aside)

    return damage


def _hard_link(which: Callable[[Path], Path]) -> Damage:
    return lambda state: os.link(which(state), state.parent / "extra-link")


def _unlink(which: Callable[[Path], Path]) -> Damage:
    return lambda state: which(state).unlink()


def _truncate(which: Callable[[Path], Path]) -> Damage:
    def damage(state: Path) -> None:
        data = which(state).read_bytes()
        which(state).write_bytes(data[: len(data) // 2])

    return damage


def _guard_dangling_symlink(state: Path) -> None:
    _guard(state).unlink()
    _guard(state).symlink_to(state.parent / "no-such-guard")


def _guard_directory(state: Path) -> None:
    _guard(state).unlink()
    _guard(state).mkdir(0o700)


def _replace_by_directory(which: Callable[[Path], Path]) -> Damage:
    def damage(state: Path) -> None:
        which(state).unlink()
        which(state).mkdir(0o700)

    return damage


def _foreign_owner(which: Callable[[Path], Path]) -> Damage:
    return lambda state: os.chown(which(state), 12345, 12345)


def _remove(*patterns: str) -> Damage:
    def damage(state: Path) -> None:
        for pattern in patterns:
            for path in state.glob(pattern):
                path.unlink()

    return damage


def _foreign_file_in_blobs(state: Path) -> None:
    (state / "blobs" / "README").write_bytes(b"not a blob")
    os.chmod(state / "blobs" / "README", 0o600)


def _garbage(which: Callable[[Path], Path], size: int = 4096) -> Damage:
    def damage(state: Path) -> None:
        which(state).write_bytes(os.urandom(size))

    return damage


def _first(sub: str, suffix: str) -> Callable[[Path], Path]:
    return lambda state: sorted(p for p in (state / sub).iterdir() if p.name.endswith(suffix))[0]


def _dir_symlink(sub: str) -> Damage:
    def damage(state: Path) -> None:
        aside = state.parent / (sub + ".aside")
        (state / sub).rename(aside)
        (state / sub).symlink_to(aside)

    return damage


def _leftover_temporary(state: Path) -> None:
    path = state / "records" / ".x.rec.tmp-1-1"
    path.write_bytes(b"half a record")
    os.chmod(path, 0o600)


# name -> (damage, whether a correct service must refuse it)
CASES: dict[str, tuple[Damage, bool]] = {
    "undamaged": (lambda state: None, False),
    "owner_db_deleted": (_remove("owner.db"), False),
    "foreign_file_in_blobs": (_foreign_file_in_blobs, False),
    "payload_mode_0644": (_chmod(_payload, 0o644), True),
    "payload_deleted": (_unlink(_payload), True),
    "payload_truncated": (_truncate(_payload), True),
    "payload_symlink": (_symlink_to_copy(_payload), True),
    "payload_hard_link": (_hard_link(_payload), True),
    "blob_mode_0644": (_chmod(_blob, 0o644), True),
    "blob_symlink": (_symlink_to_copy(_blob), True),
    "guard_deleted": (_unlink(_guard), True),
    "guard_dangling_symlink": (_guard_dangling_symlink, True),
    "guard_symlink": (_symlink_to_copy(_guard), True),
    "guard_directory": (_guard_directory, True),
    "guard_mode_0644": (_chmod(_guard, 0o644), True),
    "guard_hard_link": (_hard_link(_guard), True),
    "guard_dir_mode_0755": (_chmod(lambda s: s / "records-v2", 0o755), True),
    "secret_mode_0644": (_chmod(lambda s: s / "secret", 0o644), True),
    "secret_deleted": (_remove("secret"), True),
    "owner_db_garbage": (_garbage(lambda s: s / "owner.db"), True),
    "owner_db_mode_0644": (_chmod(lambda s: s / "owner.db", 0o644), True),
    "manifest_garbage": (_garbage(lambda s: s / "MANIFEST", 300), True),
    "manifest_truncated": (_truncate(lambda s: s / "MANIFEST"), True),
    "secret_wrong_size": (_garbage(lambda s: s / "secret", 16), True),
    "record_file_truncated": (_truncate(_first("records", ".rec")), True),
    "log_segment_deleted": (_unlink(_first("wal", ".seg")), True),
    "catalog_garbage": (_garbage(lambda s: s / "CATALOG"), False),  # derived: every file is read instead
    "records_dir_mode_0755": (_chmod(lambda s: s / "records", 0o755), True),
    "blobs_dir_mode_0755": (_chmod(lambda s: s / "blobs", 0o755), True),
    "payloads_dir_symlink": (_dir_symlink("payloads"), True),
    "leftover_temporary": (_leftover_temporary, False),
    "manifest_and_log_deleted": (_remove("MANIFEST", "wal/*.seg", "HIGHWATER"), True),
    "manifest_log_records_deleted": (
        _remove("MANIFEST", "CATALOG", "wal/*.seg", "HIGHWATER", "records/*.rec"),
        True,
    ),
    "manifest_deleted": (_remove("MANIFEST"), True),
    "highwater_deleted": (_remove("HIGHWATER"), True),
    "highwater_truncated": (_truncate(lambda s: s / "HIGHWATER"), True),
    "highwater_mode_0644": (_chmod(lambda s: s / "HIGHWATER", 0o644), True),
    "highwater_symlink": (_symlink_to_copy(lambda s: s / "HIGHWATER"), True),
    "highwater_hard_link": (_hard_link(lambda s: s / "HIGHWATER"), True),
    "highwater_directory": (_replace_by_directory(lambda s: s / "HIGHWATER"), True),
}
if os.geteuid() == 0:
    CASES["guard_foreign_owner"] = (_foreign_owner(_guard), True)
    CASES["payload_foreign_owner"] = (_foreign_owner(_payload), True)


@pytest.fixture(scope="module")
def used_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("used")
    config, env = make_config(root)

    async def fill() -> None:
        async with running(config, env, run_worker=False) as h:
            claimed = await reply_run(h.service, h.producer, {"summary": "s", "detail": DETAIL})
            rec = h.service.repo.get(claimed.id)
            assert rec is not None and rec.result is not None and rec.result.payload_digest is not None
            await h.service.store.checkpoint()  # record files and a catalog to damage
            await reply_run(h.service, h.producer, {"summary": "after"}, run_id="run-2")  # and a log

    anyio.run(fill)
    state = Path(config.state_dir)
    assert _guard(state).is_file() and _payload(state).is_file() and _blob(state).is_file()
    yield root


def _serve_verdict(root: Path) -> tuple[bool, str, str]:
    config = afterword.load_config(root / "afterword.json", environ=ENV)

    async def open_once() -> None:
        async with afterword.open_service(config, environ=ENV, serve_http=False, run_worker=False):
            pass

    try:
        anyio.run(open_once)
    except (StoreError, WalError, DiskError, MigrationError) as exc:
        # doctor calls damage that names no rule "corrupt" (a file that does not decode)
        return False, getattr(exc, "rule", "") or "corrupt", getattr(exc, "path", "")
    return True, "", ""


def _doctor_verdict(state: Path) -> tuple[bool, str, str]:
    d = diagnose(str(state))
    return d.healthy, d.rule, d.path


@pytest.mark.parametrize("case", sorted(CASES))
def test_doctor_and_serve_agree(used_state: Path, tmp_path: Path, case: str) -> None:
    damage, must_refuse = CASES[case]
    root = tmp_path / "copy"
    shutil.copytree(used_state, root, symlinks=True)
    state = root / "state"
    damage(state)
    doctor = _doctor_verdict(state)
    serve = _serve_verdict(root)
    assert doctor == serve, f"doctor {doctor} serve {serve}"
    assert serve[0] is not must_refuse, serve

"""Issue 34, point 3: every write through the state root takes the poison path, and no
file-system call of the durability layer goes around the disk seam.

A failed ``truncate`` or ``fallocate`` leaves the file's size or allocation unknown, exactly
as a failed ``pwrite`` leaves its bytes unknown: the root refuses every later mutation until
it is reopened (never retried). ``StateRoot`` holds its ``CheckedRoot`` instead of
inheriting it.
"""

from __future__ import annotations

import ast
import errno
import os
from pathlib import Path

import pytest

from afterword.disk import DiskFailedError, DurabilityError, OsDisk, StateRoot
from afterword.disk.root import CheckedRoot

ROOT = Path(__file__).resolve().parents[2]


class FailingDisk(OsDisk):
    """Fails the named seam calls with EIO; records every mkdir."""

    def __init__(self, *failing: str) -> None:
        self.failing = set(failing)
        self.mkdirs: list[str] = []

    def ftruncate(self, fd: int, length: int) -> None:
        if "ftruncate" in self.failing:
            raise OSError(errno.EIO, "injected ftruncate failure")
        super().ftruncate(fd, length)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        if "fallocate" in self.failing:
            raise OSError(errno.EIO, "injected fallocate failure")
        super().fallocate(fd, offset, length)

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        self.mkdirs.append(path)
        super().mkdir(path, mode)


@pytest.mark.parametrize("operation", ["truncate", "fallocate"])
def test_a_failed_truncate_or_fallocate_poisons_the_root(state_dir: str, operation: str) -> None:
    disk = FailingDisk("ftruncate", "fallocate")
    root = StateRoot(state_dir, disk)
    handle = root.open_file("f", writable=True, create=True)
    call = root.truncate if operation == "truncate" else root.fallocate
    with pytest.raises(DurabilityError) as failed:
        call(handle, 4096)
    assert failed.value.operation == operation
    assert isinstance(root.failed, DurabilityError)
    disk.failing.clear()
    with pytest.raises(DiskFailedError):
        root.pwrite(handle, b"after", 0)  # refused: reopen to recover
    with pytest.raises(DiskFailedError):
        call(handle, 8192)  # and never retried
    root.close(handle)


def test_truncate_and_fallocate_work_on_a_healthy_root(state_dir: str) -> None:
    root = StateRoot(state_dir)
    handle = root.open_file("f", writable=True, create=True)
    root.fallocate(handle, 8192)
    assert os.fstat(handle.fd).st_size == 8192
    root.truncate(handle, 100)
    assert os.fstat(handle.fd).st_size == 100 and root.failed is None
    root.close(handle)


def test_missing_parents_of_the_root_are_made_through_the_seam(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    disk = FailingDisk()
    target = tmp_path / "a" / "b" / "state"
    StateRoot(str(target), disk)
    assert disk.mkdirs == [str(tmp_path / "a"), str(tmp_path / "a" / "b"), str(target)]


def test_the_state_root_holds_its_checked_root() -> None:
    assert not issubclass(StateRoot, CheckedRoot)


# Calls that touch the file system. The seam (``disk/seam.py``) is the one module allowed them
# in the durability layer; ``disk/private.py`` and ``disk/scratch.py`` build their own paths on
# a ``Disk`` too, and only join and split path strings with ``os.path``.
_FS_CALLS = {
    "os": {
        "open",
        "close",
        "pwrite",
        "pread",
        "write",
        "read",
        "fsync",
        "fdatasync",
        "ftruncate",
        "truncate",
        "posix_fallocate",
        "stat",
        "lstat",
        "fstat",
        "rename",
        "replace",
        "unlink",
        "remove",
        "mkdir",
        "makedirs",
        "rmdir",
        "listdir",
        "scandir",
        "chmod",
        "chown",
        "link",
        "symlink",
        "removedirs",
        "utime",
    },
    "fcntl": {"flock", "lockf", "fcntl"},
    "sqlite3": {"connect"},
    "shutil": {"rmtree", "copy", "copyfile", "move"},
}
_LAYER = ("afterword/disk", "afterword/wal", "afterword/store/ownership.py", "afterword/store/keyed_locks.py")


def fs_calls_outside_the_seam(root: Path) -> list[str]:
    found = []
    paths: list[Path] = []
    for part in _LAYER:
        where = root / part
        paths += sorted(where.rglob("*.py")) if where.is_dir() else [where] if where.exists() else []
    for path in paths:
        if path.name == "seam.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and node.func.attr in _FS_CALLS.get(owner.id, ()):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {owner.id}.{node.func.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                found.append(f"{path.relative_to(root)}:{node.lineno} open")
    return found


def test_no_file_system_call_outside_the_disk_seam() -> None:
    assert fs_calls_outside_the_seam(ROOT) == []


def test_the_seam_check_finds_a_call_around_the_seam(tmp_path: Path) -> None:
    (tmp_path / "afterword" / "disk").mkdir(parents=True)
    (tmp_path / "afterword" / "disk" / "bad.py").write_text(
        "import os\nos.makedirs('x')\nos.path.join('a')\n"
    )
    assert fs_calls_outside_the_seam(tmp_path) == ["afterword/disk/bad.py:2 os.makedirs"]

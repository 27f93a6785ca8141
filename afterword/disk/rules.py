"""The fail-closed rules every state file and directory must pass (see ``root.py``), and the
names of the files an interrupted atomic write leaves behind."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

from .errors import UnsafeStateError
from .seam import Disk

DIR_MODE = 0o700
FILE_MODE = 0o600
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
TEMP_MARK = ".tmp-"


def is_temp_name(name: str) -> bool:
    """Temporaries of an interrupted atomic write: cleanup-only, never committed evidence."""
    return name.startswith(".") and TEMP_MARK in name


@dataclass
class FileHandle:
    """An open, validated file. ``dev``/``ino`` are what the path pointed to at open."""

    fd: int
    path: str
    dev: int
    ino: int
    closed: bool = field(default=False)


def _check_owner_mode(path: str, st: os.stat_result, euid: int) -> None:
    if st.st_uid != euid:
        raise UnsafeStateError(path, "wrong_owner", f"owner uid {st.st_uid}, expected {euid}")
    if st.st_mode & 0o077:
        raise UnsafeStateError(path, "permissive_mode", f"mode {stat.S_IMODE(st.st_mode):04o}")


def check_file_stat(path: str, st: os.stat_result, euid: int) -> None:
    """The per-file rules: regular, one link, owner, no group/other bits."""
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeStateError(path, "not_regular")
    if st.st_nlink != 1:
        raise UnsafeStateError(path, "hard_link", f"{st.st_nlink} links")
    _check_owner_mode(path, st, euid)


def check_dir_stat(path: str, st: os.stat_result, euid: int) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateError(path, "not_directory")
    _check_owner_mode(path, st, euid)


def open_error(disk: Disk, path: str, exc: OSError, *, directory: bool) -> Exception:
    """Name the rule a failed open broke (a symlink, a non-directory, a missing entry)."""
    if exc.errno == errno.ELOOP:
        return UnsafeStateError(path, "symlink")
    if exc.errno == errno.ENOTDIR:
        # Linux answers O_DIRECTORY|O_NOFOLLOW on a symlink with ENOTDIR, not ELOOP, so
        # ask what the entry is (the open already failed; this only names the rule).
        try:
            is_link = stat.S_ISLNK(disk.lstat(path).st_mode)
        except OSError:
            is_link = False
        if is_link or not directory:
            return UnsafeStateError(path, "symlink")
        return UnsafeStateError(path, "not_directory")
    if exc.errno == errno.ENOENT:
        return UnsafeStateError(path, "missing")
    if exc.errno == errno.EISDIR and not directory:
        # A writable open of a directory fails before fstat could name the rule.
        return UnsafeStateError(path, "not_regular")
    return exc

"""A short-lived owner-only file in a private directory of its own (a secret handed to a
program that only takes a path, such as a browser).

Unlike :func:`~afterword.disk.private.write_private_file` nothing here is fsynced, on purpose:
the file lives for a minute at most, and a secret that never needed to survive a power loss
is better left in the page cache (often a tmpfs) than pushed to the disk.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile

from .errors import UnsafeStateError
from .seam import Disk, OsDisk

__all__ = ["private_scratch_file", "remove_private_scratch"]


def private_scratch_file(
    name: str, data: bytes, *, prefix: str, parent: str | None = None, disk: Disk | None = None
) -> str:
    """Write ``data`` to ``name`` in a new directory (mode 0700, ours) under ``parent`` (the
    temporary directory by default); returns the file's path. The file is created 0600 with
    ``O_EXCL | O_NOFOLLOW``, so no other user can read it, even briefly. Remove both with
    :func:`remove_private_scratch`."""
    d = disk if disk is not None else OsDisk()
    base = parent if parent is not None else tempfile.gettempdir()
    for _ in range(16):
        folder = os.path.join(base, prefix + secrets.token_hex(8))
        try:
            d.mkdir(folder, 0o700)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(f"no free name for a private directory under {base}")
    path = os.path.join(folder, name)
    try:
        st = d.lstat(folder)
        # mkdir never widens its mode, but a directory we did not make must not be used.
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeStateError(folder, "not_directory")
        if st.st_uid != os.geteuid():
            raise UnsafeStateError(folder, "wrong_owner")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise UnsafeStateError(folder, "permissive_mode", oct(stat.S_IMODE(st.st_mode)))
        fd = d.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            d.pwrite(fd, data, 0)
        finally:
            d.close(fd)
    except BaseException:
        remove_private_scratch(path, disk=d)
        raise
    return path


def remove_private_scratch(path: str, disk: Disk | None = None) -> None:
    """Remove the file and its directory, whichever of them is still there."""
    d = disk if disk is not None else OsDisk()
    try:
        d.unlink(path)
    except FileNotFoundError:
        pass
    try:
        d.rmdir(os.path.dirname(path))
    except FileNotFoundError:
        pass

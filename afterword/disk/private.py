"""One owner-only file outside the state directory (a credential handed to another program)."""

from __future__ import annotations

import os
import stat

from .seam import Disk, OsDisk


def write_private_file(path: str, data: bytes, disk: Disk | None = None) -> None:
    """Create or replace ``path`` with ``data``, mode 0600, durably.

    The directory may be any the caller can write (a scraper's config folder); the file is
    written to a fresh temporary beside it (``O_EXCL``, ``O_NOFOLLOW``, created 0600 so the
    secret is never readable by others, even briefly), fsynced, renamed over ``path``, and the
    directory fsynced. An existing symlink or non-regular file at ``path`` is refused.
    """
    d = disk if disk is not None else OsDisk()
    target = os.path.abspath(path)
    try:
        st = d.lstat(target)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise IsADirectoryError(f"{target} exists and is not a regular file")
    temp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.tmp-{os.getpid()}")
    fd = d.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            d.pwrite(fd, data, 0)
            d.fsync(fd)
        finally:
            d.close(fd)
        d.rename(temp, target)
    except BaseException:
        try:
            d.unlink(temp)
        except OSError:
            pass
        raise
    d.fsync_dir(os.path.dirname(target))

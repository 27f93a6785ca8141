"""The disk seam: every file-system effect of afterword passes through here."""

from .errors import (
    DiskError,
    DiskFailedError,
    DurabilityError,
    StorageFullError,
    UnsafeStateError,
    storage_errno,
)
from .private import write_private_file
from .safe import DIR_MODE, FILE_MODE, FileHandle, StateRoot, is_temp_name
from .seam import Disk, NoSyncDisk, OsDisk

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "Disk",
    "DiskError",
    "DiskFailedError",
    "DurabilityError",
    "FileHandle",
    "NoSyncDisk",
    "OsDisk",
    "StateRoot",
    "StorageFullError",
    "UnsafeStateError",
    "is_temp_name",
    "storage_errno",
    "write_private_file",
]

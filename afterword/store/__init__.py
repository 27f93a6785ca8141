"""The ``per-record-v4`` record store: ownership lock, WAL commits, per-record files."""

from .codec import FORMAT, MAX_KEY_BYTES, Manifest
from .errors import (
    InvalidKeyError,
    RecordTooLarge,
    StoreClosedError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
    VersionConflict,
)
from .readonly import StoreView, open_readonly
from .store import (
    MAX_RECORD_BYTES,
    Delete,
    Mutation,
    PendingCommit,
    Put,
    Record,
    RecordStore,
    StoreOptions,
    StoreStatistics,
    TransactionInfo,
)

__all__ = [
    "FORMAT",
    "MAX_KEY_BYTES",
    "MAX_RECORD_BYTES",
    "Delete",
    "InvalidKeyError",
    "Manifest",
    "Mutation",
    "PendingCommit",
    "Put",
    "Record",
    "RecordStore",
    "RecordTooLarge",
    "StoreClosedError",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "StoreOptions",
    "StoreStatistics",
    "StoreView",
    "TransactionInfo",
    "VersionConflict",
    "open_readonly",
]

"""The ``per-record-v5`` record store: ownership lock, WAL commits, per-record files."""

from .codec import FORMAT, MAX_KEY_BYTES, Manifest
from .collection import Collection, CorruptRecordError
from .errors import (
    InvalidKeyError,
    OwnershipLostError,
    RecordTooLarge,
    StoreClosedError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
    VersionConflict,
)
from .keyed_locks import KeyedLocks, KeyLock, shared_locks
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
from .types import Summarizer

__all__ = [
    "FORMAT",
    "MAX_KEY_BYTES",
    "MAX_RECORD_BYTES",
    "Collection",
    "CorruptRecordError",
    "Delete",
    "InvalidKeyError",
    "KeyLock",
    "KeyedLocks",
    "Manifest",
    "Mutation",
    "OwnershipLostError",
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
    "Summarizer",
    "TransactionInfo",
    "VersionConflict",
    "open_readonly",
    "shared_locks",
]

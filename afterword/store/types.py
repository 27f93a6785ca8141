"""The record store's public value types: mutations, options, statistics (no behaviour)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..wal import WalOptions
from .codec import Op, RecordImage

MAX_RECORD_BYTES = 2 * 1024 * 1024

Record = RecordImage
"""A committed record: ``key``, ``lsn`` (its version), ``value`` bytes, ``blobs`` it references."""

Watcher = Callable[[str, Record | None, Record | None], None]


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    blobs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Summarizer:
    """A compact summary of each record under one prefix, kept in the checkpoint catalog.

    A watcher that registers one (:meth:`RecordStore.watch`) is told about the records an
    open found only in the catalog by their summary, without their files being read.
    ``summarize(value)`` makes the summary of a record's bytes at each checkpoint (once per
    version); ``tag`` names that derivation, and a summary written under another tag is never
    used: such records are read as usual. The summary is derived data: the record file stays
    the source of truth, and reading a record checks its file as always.
    """

    tag: str
    summarize: Callable[[bytes], bytes]


@dataclass(frozen=True)
class Delete:
    key: str


Mutation = Put | Delete


@dataclass(frozen=True)
class TransactionInfo:
    """What :attr:`StoreOptions.observe_transaction` is told about one transaction."""

    ops: tuple[Op, ...]  # the after-images: key, value (None: a delete), blobs referenced
    payload_bytes: int  # the encoded transaction: what the WAL frames (``max_payload`` bounds it)

    @property
    def largest_value(self) -> int:
        """The largest record value put (``max_record_bytes`` bounds it)."""
        return max((len(op.value) for op in self.ops if op.value is not None), default=0)


@dataclass(frozen=True)
class StoreOptions:
    """``observe_transaction`` is a test hook (never set in production): it is called with
    every transaction the store is asked to commit, before the store checks its limits and
    before anything is written (after the version checks, so a transaction it sees is one
    the store would write unless it is too large). An exception it raises refuses the
    transaction (nothing is written, the caller gets the exception), which lets a test cut a
    service at any commit point, follow every record it writes, and check that no
    transaction exceeds the limits."""

    wal: WalOptions = field(default_factory=WalOptions)
    max_record_bytes: int = MAX_RECORD_BYTES
    checkpoint_threads: int = 8
    auto_checkpoint: bool = True
    # How often a serving host re-checks that its directory and lock file are still the ones
    # it locked (RecordStore.check_ownership); a few lstat calls each time.
    ownership_check_seconds: float = 2.0
    observe_transaction: Callable[[TransactionInfo], None] | None = None


@dataclass
class StoreStatistics:
    records: int
    dirty: int
    next_lsn: int
    checkpoints: int
    last_checkpoint_seconds: float
    recovery_seconds: float
    replayed_transactions: int
    wal_commits: int
    wal_fsyncs: int
    wal_bytes: int
    unread: int = 0  # records known from the checkpoint catalog whose file is not read yet

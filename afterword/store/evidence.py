"""Evidence of loss: what a MANIFEST promises, checked against what an open found (pure).

A crash can only lose what was never acknowledged; damage (a deleted, truncated, garbled or
rolled-back file) can lose anything. The MANIFEST therefore records, each time it is
written, enough to tell the two apart (see ``docs/storage-format.md`` section 5):

* ``record_digest``/``record_count``: an order-independent sum of a hash of every
  ``(key, version)`` as of ``checkpoint_lsn``. Replay carries it forward with each
  operation's ``prior`` version, so after recovery it must equal the digest of the records
  in memory; a record file deleted, or rolled back, since the checkpoint breaks the sum.
* record files newer than ``checkpoint_lsn`` are legitimate only as the early writes of an
  interrupted checkpoint, i.e. when replay reproduces exactly that version.
* ``acked_lsn``: replay must reach it.
* ``secret_check``: the secret on disk must be the one the state was written with.

Every failure is an :class:`EvidenceError` naming the path and the rule.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

import xxhash

from .errors import StoreCorruptError

_MASK = (1 << 128) - 1


class EvidenceError(StoreCorruptError):
    """State on disk holds less than its MANIFEST says was acknowledged (fail closed).

    ``rule`` is one of ``record_digest``, ``manifest_behind_records``, ``acknowledged_lost``,
    ``secret_missing``, ``secret_mismatch``, ``segment_missing``, ``segment_short``,
    ``segment_replaced``, and for out-of-line result payloads (``afterword.app.payloads``)
    ``payload_missing``, ``payload_size``.
    """

    def __init__(self, path: str, rule: str, detail: str = "") -> None:
        self.path = path
        self.rule = rule
        self.detail = detail
        super().__init__(f"{path}: {rule}" + (f" ({detail})" if detail else ""))


def entry_hash(key: str, lsn: int) -> int:
    return xxhash.xxh3_128_intdigest(key.encode() + b"\0" + lsn.to_bytes(8, "little"))


class Digest:
    """A running, order-independent digest of a set of ``(key, version)`` pairs."""

    __slots__ = ("count", "value")

    def __init__(self, value: int = 0, count: int = 0) -> None:
        self.value = value
        self.count = count

    @classmethod
    def parse(cls, text: str, count: int) -> Digest:
        return cls(int(text, 16), count)

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, int]]) -> Digest:
        # entry_hash inlined: an open sums tens of thousands of these.
        h = xxhash.xxh3_128_intdigest
        total = count = 0
        for key, lsn in pairs:
            total += h(key.encode() + b"\0" + lsn.to_bytes(8, "little"))
            count += 1
        return cls(total & _MASK, count)

    def add(self, key: str, lsn: int) -> None:
        self.value = (self.value + entry_hash(key, lsn)) & _MASK
        self.count += 1

    def merge(self, other: Digest) -> None:
        """Add every pair of ``other`` (a digest of a disjoint set)."""
        self.value = (self.value + other.value) & _MASK
        self.count += other.count

    def remove(self, key: str, lsn: int) -> None:
        self.value = (self.value - entry_hash(key, lsn)) & _MASK
        self.count -= 1

    def text(self) -> str:
        return f"{self.value:032x}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Digest) and (self.value, self.count) == (other.value, other.count)

    def __hash__(self) -> int:
        return hash((self.value, self.count))


def secret_check(secret: bytes) -> str:
    """A MAC of a constant under the secret: proves which secret wrote the MANIFEST, reveals
    nothing about it."""
    return hmac.new(secret, b"afterword/v4/manifest-secret-check", hashlib.sha256).hexdigest()[:32]


def check_secret(path: str, secret: bytes | None, expected: str) -> None:
    if secret is None:
        raise EvidenceError(
            path, "secret_missing", "state exists, so the secret it was written with must too"
        )
    if expected and not hmac.compare_digest(secret_check(secret), expected):
        raise EvidenceError(path, "secret_mismatch", "not the secret this state was written with")


class ReplayCheck:
    """Carries the MANIFEST's promises through replay; :meth:`finish` compares the result.

    ``loaded`` maps each key read from a record file to its version. Replay
    (``replay.py``) carries ``expected`` forward: minus ``h(key, prior)`` for each
    operation, plus ``h(key, lsn)`` for each put, and strikes from ``newer`` each record
    file a put reproduces.
    """

    def __init__(
        self, *, records_path: str, checkpoint_lsn: int, digest: str, count: int, loaded: dict[str, int]
    ) -> None:
        self.records_path = records_path
        self.expected = Digest.parse(digest, count) if digest else None
        # Record files newer than the checkpoint must each be reproduced by replay.
        self.newer = {(key, lsn) for key, lsn in loaded.items() if lsn > checkpoint_lsn}

    def finish(self, actual: Digest) -> None:
        if self.newer:
            key, lsn = min(self.newer, key=lambda item: item[1])
            raise EvidenceError(
                self.records_path,
                "manifest_behind_records",
                f"{len(self.newer)} record file(s), e.g. {key!r} at version {lsn}, are newer "
                "than the MANIFEST and the log can account for",
            )
        if self.expected is not None and actual != self.expected:
            raise EvidenceError(
                self.records_path,
                "record_digest",
                f"{actual.count} records, the MANIFEST and log account for {self.expected.count}"
                + ("" if actual.count != self.expected.count else " with other versions"),
            )

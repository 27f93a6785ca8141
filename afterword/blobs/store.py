"""Content-addressed blob store with an aggregate quota, HMAC binding and a sweep.

A blob is named by the blake3 hex digest of its bytes and written with the atomic-replace
protocol (temp, fsync, rename, directory fsync) before :meth:`BlobStore.put` returns, so a
record that references it can commit afterwards. Reads verify the digest. A blob written but
not yet referenced by a committed record is *pinned* and survives a sweep until unpinned.
"""

from __future__ import annotations

import hmac
import re
import stat
import threading
from hashlib import sha256

import blake3

from ..disk import StateRoot, UnsafeStateError
from ..disk.rules import check_file_stat
from ..store.keys import BLOB_BINDING, derive_key
from .errors import (
    BlobBindingError,
    BlobCorruptError,
    BlobMissingError,
    BlobQuotaExceeded,
    BlobTooLarge,
)

DEFAULT_QUOTA = 256 * 1024 * 1024
DEFAULT_MAX_BLOB = 16 * 1024 * 1024
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
_BIND_DOMAIN = b"afterword-blob-binding-v1\x00"


def blob_digest(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def stored_sizes(root: StateRoot, rel_dir: str) -> dict[str, int]:
    """The size of every blob in ``rel_dir`` (absent: none), each held to the state-file rules
    (``UnsafeStateError``: a symlink, a non-regular file, a hard link, another owner, group or
    other bits). Files not named by a digest are foreign: left alone and never served. The
    service's open and ``doctor`` both judge a blob directory by this function alone."""
    if not root.exists(rel_dir):
        return {}
    sizes: dict[str, int] = {}
    for name in root.listdir(rel_dir):
        if not _DIGEST_RE.match(name):
            continue
        path = root.path(f"{rel_dir}/{name}")
        st = root.disk.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeStateError(path, "symlink")
        check_file_stat(path, st, root.euid)
        sizes[name] = st.st_size
    return sizes


def check_digest(digest: str) -> None:
    if not _DIGEST_RE.match(digest):
        raise ValueError(f"not a blake3 hex digest: {digest!r}")


class BlobStore:
    """Blobs under ``<root>/<rel_dir>``; quota accounting is rebuilt at open."""

    def __init__(
        self,
        root: StateRoot,
        secret: bytes,
        *,
        rel_dir: str = "blobs",
        quota: int = DEFAULT_QUOTA,
        max_blob: int = DEFAULT_MAX_BLOB,
    ) -> None:
        self.root = root
        self.rel_dir = rel_dir
        self.quota = quota
        self.max_blob = min(max_blob, quota)
        self._bind_key = derive_key(secret, BLOB_BINDING)
        self._sizes: dict[str, int] = {}
        self._pinned: dict[str, int] = {}
        # put() may run in a worker thread (it fsyncs); the lock keeps the quota check, the
        # write and the accounting one step, and keeps the sweep from racing a put.
        self._lock = threading.RLock()
        root.ensure_dir(rel_dir)
        root.remove_temporaries(rel_dir)
        self._sizes = stored_sizes(root, rel_dir)

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def __contains__(self, digest: object) -> bool:
        with self._lock:
            return digest in self._sizes

    def size(self, digest: str) -> int | None:
        """The stored size of ``digest`` (as found at open or written since), None if absent."""
        with self._lock:
            return self._sizes.get(digest)

    def digests(self) -> set[str]:
        with self._lock:
            return set(self._sizes)

    def put(self, data: bytes) -> str:
        """Store ``data`` durably (idempotent per content) and pin it; return its digest.

        Safe to call from a worker thread.
        """
        if len(data) > self.max_blob:
            raise BlobTooLarge(f"blob of {len(data)} bytes exceeds {self.max_blob}")
        digest = blob_digest(data)
        with self._lock:
            if digest not in self._sizes:
                used = sum(self._sizes.values())
                if used + len(data) > self.quota:
                    raise BlobQuotaExceeded(
                        f"blob of {len(data)} bytes would exceed the {self.quota}-byte quota ({used} in use)"
                    )
                self.root.write_atomic(f"{self.rel_dir}/{digest}", data)
                self._sizes[digest] = len(data)
            self._pinned[digest] = self._pinned.get(digest, 0) + 1
        return digest

    def unpin(self, digest: str) -> None:
        """The caller's record committed (or gave up): the sweep may judge this blob again."""
        with self._lock:
            n = self._pinned.get(digest, 0) - 1
            if n > 0:
                self._pinned[digest] = n
            else:
                self._pinned.pop(digest, None)

    def get(self, digest: str) -> bytes:
        """The blob's bytes, verified against its digest."""
        check_digest(digest)
        if digest not in self._sizes and not self.root.exists(f"{self.rel_dir}/{digest}"):
            raise BlobMissingError(f"blob {digest} is not stored")
        try:
            data = self.root.read_file(f"{self.rel_dir}/{digest}", max_size=self.max_blob)
        except FileNotFoundError:
            raise BlobMissingError(f"blob {digest} is not stored") from None
        if blob_digest(data) != digest:
            raise BlobCorruptError(f"blob {digest}: content does not match its digest")
        return data

    # -- binding -----------------------------------------------------------------------------
    def bind(self, digest: str, metadata: bytes) -> str:
        """An HMAC (hex) binding ``digest`` to caller-supplied immutable ``metadata``."""
        check_digest(digest)
        msg = _BIND_DOMAIN + digest.encode() + b"\x00" + metadata
        return hmac.new(self._bind_key, msg, sha256).hexdigest()

    def verify_binding(self, digest: str, metadata: bytes, mac: str) -> None:
        expected = self.bind(digest, metadata)
        # compare_digest raises TypeError on non-ASCII str; a mangled MAC is just a mismatch.
        if not mac.isascii() or not hmac.compare_digest(expected, mac):
            raise BlobBindingError(f"blob {digest}: binding does not match its metadata")

    # -- sweep -------------------------------------------------------------------------------
    def sweep(self, referenced: set[str]) -> list[str]:
        """Remove every blob that is neither referenced nor pinned; crash-safe (idempotent)."""
        with self._lock:
            doomed = [d for d in self._sizes if d not in referenced and d not in self._pinned]
            for digest in doomed:
                self.root.remove(f"{self.rel_dir}/{digest}", sync_dir=False)
                del self._sizes[digest]
            if doomed:
                self.root.sync_dir(self.rel_dir)
            return doomed

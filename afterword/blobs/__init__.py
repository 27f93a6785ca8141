"""Content-addressed snapshot blobs: blake3 names, quota, HMAC binding, sweep."""

from .errors import (
    BlobBindingError,
    BlobCorruptError,
    BlobError,
    BlobMissingError,
    BlobQuotaExceeded,
    BlobTooLarge,
)
from .store import DEFAULT_QUOTA, BlobStore, blob_digest

__all__ = [
    "DEFAULT_QUOTA",
    "BlobBindingError",
    "BlobCorruptError",
    "BlobError",
    "BlobMissingError",
    "BlobQuotaExceeded",
    "BlobStore",
    "BlobTooLarge",
    "blob_digest",
]

"""Errors of the blob store."""

from __future__ import annotations

from ..errors import AfterwordError, CallerError, StateError


class BlobError(AfterwordError):
    """Base of every error raised by ``afterword.blobs``."""


class BlobQuotaExceeded(BlobError, CallerError):
    """Writing the blob would exceed the aggregate quota; nothing was written."""


class BlobCorruptError(BlobError, StateError):
    """A stored blob's bytes do not match its content address."""


class BlobMissingError(BlobError, StateError):
    """No blob is stored under that digest."""


class BlobBindingError(BlobError, StateError):
    """The HMAC binding of a digest to its metadata does not verify: metadata was altered."""


class BlobTooLarge(BlobError, CallerError):
    """A single blob is larger than the configured per-blob limit."""

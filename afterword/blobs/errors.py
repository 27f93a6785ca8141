"""Errors of the blob store."""

from __future__ import annotations


class BlobError(Exception):
    """Base of every error raised by ``afterword.blobs``."""


class BlobQuotaExceeded(BlobError):
    """Writing the blob would exceed the aggregate quota; nothing was written."""


class BlobCorruptError(BlobError):
    """A stored blob's bytes do not match its content address."""


class BlobMissingError(BlobError):
    """No blob is stored under that digest."""


class BlobBindingError(BlobError):
    """The HMAC binding of a digest to its metadata does not verify: metadata was altered."""


class BlobTooLarge(BlobError):
    """A single blob is larger than the configured per-blob limit."""

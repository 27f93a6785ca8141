"""Key derivation from the store secret: one independent key per purpose (HMAC-SHA256)."""

from __future__ import annotations

import hashlib
import hmac


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A 32-byte key for ``purpose``; keys for different purposes are independent."""
    return hmac.new(secret, b"afterword/v3/" + purpose.encode(), hashlib.sha256).digest()

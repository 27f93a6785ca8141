"""Key derivation from the store secret: one independent key per purpose (HMAC-SHA256).

Every purpose label is listed here and nowhere else. A label is part of the on-disk contract:
the state directory keeps only the secret, and every token, id and binding MAC is recomputed
from ``derive_key(secret, label)``; renaming a label would invalidate every token already
handed out and every claim MAC already stored. ``tests/unit/test_key_labels.py`` pins each label's
derived key against an independent computation.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final, Literal, get_args

__all__ = [
    "BLOB_BINDING",
    "CLAIM_BINDING",
    "CLAIM_CAPABILITIES",
    "CONTINUATION_IDS",
    "HOST",
    "METRICS",
    "OPERATOR",
    "OPERATOR_CURSOR",
    "PURPOSES",
    "RESULT_TOKENS",
    "STATUS_PAGE",
    "Purpose",
    "derive_key",
]

Purpose = Literal[
    "continuation-ids",
    "result-tokens",
    "claim-capabilities",
    "operator",
    "metrics",
    "claim-binding",
    "operator-cursor",
    "blob-binding",
    "host",
    "status-page",
]
PURPOSES: Final[tuple[Purpose, ...]] = get_args(Purpose)

CONTINUATION_IDS: Final = "continuation-ids"  # deterministic continuation ids of claim identities
RESULT_TOKENS: Final = "result-tokens"  # the producer's bearer for one continuation's result
CLAIM_CAPABILITIES: Final = "claim-capabilities"  # a run's per-server claim capability tokens
OPERATOR: Final = "operator"  # the operator capability (CLI and /v1/operator/)
METRICS: Final = "metrics"  # the read-only metrics capability
CLAIM_BINDING: Final = "claim-binding"  # the MAC over a claim's immutable metadata
OPERATOR_CURSOR: Final = "operator-cursor"  # the MAC on operator list cursors
BLOB_BINDING: Final = "blob-binding"  # the MAC binding a snapshot blob's digest to its claim
HOST: Final = "host"  # the host capability (/v1/host/, a host in another process)
STATUS_PAGE: Final = "status-page"  # this state directory's tag in the status page's cookie name


def derive_key(secret: bytes, purpose: Purpose) -> bytes:
    """A 32-byte key for ``purpose``; keys for different purposes are independent."""
    return hmac.new(secret, b"afterword/v3/" + purpose.encode(), hashlib.sha256).digest()

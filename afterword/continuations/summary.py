"""What the service's indexes need of a tombstone, without the tombstone (pure).

A service with tens of thousands of tombstones needs, at start, only a few facts about each:
its state (counts by state), when its claim was made (the operator list's keyset order), when
it became terminal and whether it still needs an operator (retention and health), and its
server and route (the operator list's filters). :class:`TombstoneSummary` is those facts. The
store keeps the encoded summary of every catalogued tombstone in its checkpoint catalog, so a
service opens without reading the tombstone files; the whole tombstone is read from its file
only when something asks for it (an idempotent retry, an operator's detail page).

``SUMMARY_TAG`` names the derivation: a summary written under another tag is not used (the
tombstone is read and summarized again), so changing what :func:`summarize` computes, or how
:func:`attention` judges a tombstone, needs a new tag.
"""

from __future__ import annotations

import msgspec

from .health import attention
from .model import Tombstone, TombstoneSummary

__all__ = [
    "SUMMARY_TAG",
    "TombstoneSummary",
    "decode_summaries",
    "decode_summary",
    "encode_summary",
    "summarize",
]

SUMMARY_TAG = "tombstone-summary/1"


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TombstoneSummary)
_list_decoder = msgspec.msgpack.Decoder(list[TombstoneSummary])


def summarize(tomb: Tombstone) -> TombstoneSummary:
    return TombstoneSummary(
        id=tomb.claim.id,
        state=tomb.state,
        created_at_ms=tomb.claim.created_at_ms,
        terminal_at_ms=tomb.terminal_at_ms,
        cause=attention(tomb),
        server_name=tomb.claim.server_name,
        route=tomb.claim.route,
    )


def encode_summary(summary: TombstoneSummary) -> bytes:
    return _encoder.encode(summary)


def decode_summary(data: bytes) -> TombstoneSummary:
    """Raises ``msgspec.DecodeError`` / ``msgspec.ValidationError`` for bytes that are not one."""
    return _decoder.decode(data)


def decode_summaries(count: int, body: bytes) -> list[TombstoneSummary]:
    """``count`` encoded summaries laid end to end, decoded in one call (as the msgpack
    array they form with a 32-bit array header in front). Raises like :func:`decode_summary`,
    also when the bytes hold more or fewer than ``count`` summaries."""
    return _list_decoder.decode(b"\xdd" + count.to_bytes(4, "big") + body)

"""Open-time check of out-of-line result payload files (``docs/storage-format.md`` §10).

A live record whose accepted result lives in ``payloads/<digest>`` cannot be synthesized
without that file. Found only when the worker reads it, a missing file dead-letters an
acknowledged result (``payload_unreadable``); so opening refuses instead, naming the path
and the rule, before anything acts on the record. Only sizes are compared (the blob store
already stats every file at open): reading and hashing every payload would make opening
cost as much as the payloads are large, and the worker still verifies both digests when it
reads one. Origin snapshot blobs are not checked: a missing snapshot has a documented
fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..continuations.model import INLINE_PAYLOAD_MAX, Continuation
from ..store.evidence import EvidenceError

PAYLOADS_DIR = "payloads"  # the payload blob store's directory (the service opens it there)


def check_payload_files(
    records: Iterable[Continuation], size_of: Callable[[str], int | None], path_of: Callable[[str], str]
) -> None:
    """Raise ``EvidenceError`` (``payload_missing`` / ``payload_size``) for the first live
    record whose out-of-line payload file is absent or not the size it was written with.

    ``size_of(digest)`` is the file's size or None when absent. Records written before the
    size was recorded are held to what every out-of-line payload is: larger than the
    inline limit.
    """
    for rec in records:
        result = rec.result
        if result is None or result.payload_digest is None:
            continue
        digest = result.payload_digest
        size = size_of(digest)
        if size is None:
            raise EvidenceError(
                path_of(digest),
                "payload_missing",
                f"the accepted result of continuation {rec.id} is stored there",
            )
        expected = result.payload_size
        if (expected is not None and size != expected) or size <= INLINE_PAYLOAD_MAX:
            want = f"{expected} bytes" if expected is not None else f"more than {INLINE_PAYLOAD_MAX} bytes"
            raise EvidenceError(
                path_of(digest),
                "payload_size",
                f"{size} bytes, the result of continuation {rec.id} has {want}",
            )

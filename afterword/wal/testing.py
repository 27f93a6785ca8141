"""Test hooks of the log, exported on purpose (as etcd exports its own) so a harness turns
them on explicitly instead of patching private code.

``inline_by_batch_only``: whether a lone commit is written inline on the event loop or handed
to a worker thread normally depends on the measured ``write+fdatasync`` time and the back-off
after an overrun, so two runs of the same script can group commits differently. Inside this context every committer made there decides from the
batch alone (a batch of one that fits the tail segment is written inline), so a recorded run is
the same on every repetition. The code that writes, fdatasyncs and acknowledges is unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .committer import INLINE_BY_BATCH_ONLY

__all__ = ["inline_by_batch_only"]


@contextlib.contextmanager
def inline_by_batch_only() -> Iterator[None]:
    """Committers made inside this context (in this thread or task) ignore write timing."""
    token = INLINE_BY_BATCH_ONLY.set(True)
    try:
        yield
    finally:
        INLINE_BY_BATCH_ONLY.reset(token)

"""The one verdict on a state directory beyond the store's own open, shared by the service's
open (``open_service``) and ``afterword continuations doctor``.

The store's open (or its read-only twin) has already applied the storage rules of
``docs/storage-format.md``. What the service adds, and what ``doctor`` must therefore apply
too, or it would call a directory healthy that ``serve`` refuses:

* the rollback guard (``afterword.legacy.formats.check_guard``): its file rules, and its
  presence once v3 records exist;
* the blob directories (``blobs/``, ``payloads/``): every stored file obeys the state-file
  rules (``afterword.blobs.store.stored_sizes``, the function the blob stores open with);
* out-of-line result payloads: every live record's payload file exists at its size
  (:func:`afterword.app.payloads.check_payload_files`).

Errors: ``UnsafeStateError``, ``MigrationError`` (guard rules), ``EvidenceError`` (payloads),
each naming the path and the rule.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..blobs.store import stored_sizes
from ..continuations.model import Continuation
from ..disk import StateRoot
from ..legacy.formats import check_guard
from ..store.codec import Manifest
from .payloads import PAYLOADS_DIR, check_payload_files

BLOBS_DIR = "blobs"


def check_service_state(
    root: StateRoot, manifest: Manifest, *, v3_records: int, live: Iterable[Continuation]
) -> None:
    """Raise the first rule the directory breaks, in the order the service's open meets them
    (guard, ``blobs/``, ``payloads/``, payload files); return if the service may open it."""
    check_guard(root, manifest, have_v3=v3_records > 0)
    stored_sizes(root, BLOBS_DIR)
    payloads = stored_sizes(root, PAYLOADS_DIR)
    check_payload_files(live, payloads.get, lambda digest: root.path(f"{PAYLOADS_DIR}/{digest}"))

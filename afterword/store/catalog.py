"""The checkpoint catalog: which records the record files hold, in one file.

Opening a store with tens of thousands of records used to read every record file (an open,
an ``fstat``, a read and a close each). A checkpoint now also writes ``CATALOG``: the key,
version and blob references of every record as of the checkpoint. The MANIFEST written right
after it names the catalog by the XXH3-128 of its bytes. An open whose MANIFEST names a
catalog that is present and matches reads the catalog instead of the files, lists
``records/`` to check that every catalogued record still has its file, and reads a record's
bytes from its file only when the record is first asked for, checking that the file holds
the version the catalog says (``docs/storage-format.md`` section 4a).

The record files stay the source of truth: a catalog that is missing, unreadable or not the
one the MANIFEST names is ignored and every record file is read, as before. The catalog is
never trusted over a record file; it only says which files to expect.
"""

from __future__ import annotations

import logging
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import xxhash

from ..disk import StateRoot, UnsafeStateError
from .codec import Manifest, RecordImage, decode_record, record_file_name
from .errors import StoreCorruptError
from .evidence import EvidenceError
from .loading import RECORDS
from .types import Record, Summarizer

log = logging.getLogger("afterword.store")

CATALOG = "CATALOG"
CATALOG_MAGIC = b"AWCAT1\x00\x00"
MAX_CATALOG_BYTES = 512 * 1024 * 1024
_U64 = struct.Struct("<Q")
_lsn = operator.attrgetter("lsn")


class CatalogEntry(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One record as of the checkpoint: its key, version and the blobs it references, and
    the summary its prefix's summarizer made of it (empty: none)."""

    key: str
    lsn: int
    blobs: tuple[str, ...] = ()
    summary: bytes = b""


class CatalogBody(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    checkpoint_lsn: int
    files: str  # names_check() of the record file names the entries imply
    entries: list[CatalogEntry]
    tags: dict[str, str] = {}  # key prefix -> the tag of the summarizer its summaries came from


@dataclass(frozen=True)
class CatalogSource:
    """What a checkpoint's catalog is written from (copies taken on the event loop)."""

    records: dict[str, Record]  # read records: their entries are made from them
    unread: dict[str, CatalogEntry]  # entries still unread since the open: carried over
    summarizers: dict[str, Summarizer]  # prefix -> summarizer, as watchers registered them
    tags: dict[str, str]  # prefix -> tag of the loaded catalog (kept for unread summaries)
    cache: dict[str, tuple[int, bytes]]  # key -> (version, summary); the writer's alone


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(CatalogBody)


def names_check(names: list[str]) -> str:
    """32 hex digits: the XXH3-128 of the sorted file names joined by NUL bytes. An open
    compares the ``records/`` listing with the catalog by this one value."""
    return f"{xxhash.xxh3_128_intdigest(chr(0).join(sorted(names)).encode()):032x}"


Entry = tuple[str, int, tuple[str, ...]] | tuple[str, int, tuple[str, ...], bytes]


def encode_catalog(
    checkpoint_lsn: int, entries: Sequence[Entry], tags: dict[str, str] | None = None
) -> bytes:
    """``CATALOG`` bytes: magic, msgpack ``[checkpoint_lsn, files, [[key, lsn, [blob, ...]
    (, summary)], ...], {prefix: tag}]``, then the xxh3 of everything before it. An entry
    may carry a fourth element, its summary (see :class:`Summarizer`)."""
    files = names_check([record_file_name(e[0]) for e in entries])
    body = CATALOG_MAGIC + _encoder.encode((checkpoint_lsn, files, entries, tags or {}))
    return body + _U64.pack(xxhash.xxh3_64_intdigest(body))


def catalog_check(data: bytes) -> str:
    """How the MANIFEST names a catalog: 32 hex digits of the XXH3-128 of its bytes."""
    return f"{xxhash.xxh3_128_intdigest(data):032x}"


def decode_catalog(data: bytes) -> CatalogBody:
    if len(data) < len(CATALOG_MAGIC) + 8 or not data.startswith(CATALOG_MAGIC):
        raise StoreCorruptError("CATALOG: bad magic or truncated")
    body, check = data[:-8], _U64.unpack(data[-8:])[0]
    if xxhash.xxh3_64_intdigest(body) != check:
        raise StoreCorruptError("CATALOG: checksum mismatch")
    try:
        return _decoder.decode(body[len(CATALOG_MAGIC) :])
    except msgspec.DecodeError as exc:
        raise StoreCorruptError(f"CATALOG: {exc}") from None


def read_catalog(root: StateRoot, manifest: Manifest) -> CatalogBody | None:
    """The catalog the MANIFEST names, or None when the record files must be read instead.

    A catalog that is gone, not the one named, or inconsistent with the MANIFEST is ignored
    (with a warning): it is derived data, and the files it describes are still there to
    read. An unsafe file (a symlink, a second link, loose permissions) fails closed as
    everywhere else.
    """
    if not manifest.catalog:
        return None
    try:
        data = root.read_file(CATALOG, max_size=MAX_CATALOG_BYTES)
    except UnsafeStateError as exc:
        if exc.rule not in ("missing", "too_large"):
            raise
        log.warning("store: %s: %s; reading every record file instead", root.path(CATALOG), exc.rule)
        return None
    why = ""
    if catalog_check(data) != manifest.catalog:
        why = "not the catalog the MANIFEST names"
    else:
        try:
            body = decode_catalog(data)
        except StoreCorruptError as exc:
            why = str(exc)
        else:
            if body.checkpoint_lsn != manifest.checkpoint_lsn or len(body.entries) != manifest.record_count:
                why = "written for another checkpoint"
            elif max(map(_lsn, body.entries), default=0) > body.checkpoint_lsn:
                why = "lists a version above its checkpoint"
            else:
                return body
    log.warning("store: %s: %s; reading every record file instead", root.path(CATALOG), why)
    return None


def read_catalogued(root: StateRoot, max_record_bytes: int, wanted: list[CatalogEntry]) -> list[RecordImage]:
    """Read the record files of ``wanted`` (one directory descriptor for the batch), each
    checked like any record file and against its catalog entry."""
    names = [record_file_name(e.key) for e in wanted]
    try:
        files = root.read_all(RECORDS, names, max_size=max_record_bytes + 4096)
    except UnsafeStateError as exc:
        if exc.rule == "missing":
            raise EvidenceError(
                exc.path, "record_digest", "the checkpoint recorded this record file"
            ) from None
        raise
    out: list[RecordImage] = []
    for (name, data), entry in zip(files, wanted, strict=True):
        image = decode_record(data, name, entry.key)  # the name is the key's (record_file_name)
        if image.lsn != entry.lsn or tuple(image.blobs) != entry.blobs:
            raise EvidenceError(
                root.path(f"{RECORDS}/{name}"),
                "record_digest",
                f"holds version {image.lsn} of {image.key!r}, the checkpoint recorded {entry.lsn}",
            )
        out.append(image)
    return out

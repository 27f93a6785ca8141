"""Encodings of store transactions, record files and the manifest (pure, no I/O).

Record file: ``b"AWREC3\\x00\\x00"`` + msgpack ``RecordImage`` + xxh3-64 of all preceding bytes.
Transaction payload (inside a WAL frame): msgpack ``TxBody``.
"""

from __future__ import annotations

import re
import struct

import msgspec
import xxhash

from .errors import InvalidKeyError, StoreCorruptError

FORMAT = "per-record-v5"
FORMAT_V4 = "per-record-v4"  # read for the upgrade only: the first open writes a catalog (v5)
FORMAT_V3 = "per-record-v3"  # read for the upgrade only: the first open rewrites it as v5
RECORD_MAGIC = b"AWREC3\x00\x00"
MAX_KEY_BYTES = 120
MAX_GENERATION_BYTES = 256
MAX_MANIFEST_BYTES = 1024 * 1024
_KEY_RE = re.compile(r"^[A-Za-z0-9._:@#/+=-]+$")
_U64 = struct.Struct("<Q")


class Op(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A whole-record after-image: ``value is None`` deletes the key.

    ``prior`` is the version (lsn) the key had just before this operation, 0 when absent
    (v3 frames lack it and decode as 0). Replay uses it to carry the MANIFEST's record digest
    forward, which is how a record file lost since the checkpoint is detected.
    """

    key: str
    value: bytes | None
    blobs: tuple[str, ...] = ()
    prior: int = 0


class TxBody(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    ops: tuple[Op, ...]


class RecordImage(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    key: str
    lsn: int
    value: bytes
    blobs: tuple[str, ...] = ()


class SegmentRef(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A live WAL segment life as the MANIFEST knows it: where it is and who it is."""

    slot: int
    seq: int
    salt: str  # 16 hex digits (fixed width keeps MANIFEST sizes independent of the salt)
    first_lsn: int
    size: int  # bytes of the slot file (segment sizes are configurable)


class Manifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The checkpoint manifest: everything up to ``checkpoint_lsn`` is in record files.

    The v4 evidence fields let an open tell damage from a crash: ``acked_lsn`` (every lsn up
    to it was durable when this MANIFEST was written), ``segments`` (the live chain then),
    ``record_digest`` (sum of a hash of every (key, version) at ``checkpoint_lsn``) and
    ``secret_check`` (a MAC of a constant under the secret). v3 files lack them. ``catalog``
    (v5) names the checkpoint's ``CATALOG`` file by the XXH3-128 of its bytes ("": none, read
    every record file). ``high_water`` names the ``HIGHWATER`` file by its id (32 hex digits,
    "": none yet) and ``checksum`` is the XXH3-128 of the MANIFEST as encoded with an empty
    ``checksum`` ("": written before MANIFESTs carried one; see ``docs/storage-format.md``).
    """

    format: str = FORMAT
    generation: str
    checkpoint_lsn: int
    wal_start_seq: int
    record_count: int
    guard_required: bool = False
    meta: dict[str, str] = {}
    acked_lsn: int = 0
    segments: tuple[SegmentRef, ...] = ()
    record_digest: str = ""
    secret_check: str = ""
    catalog: str = ""
    high_water: str = ""
    checksum: str = ""


_tx_encoder = msgspec.msgpack.Encoder()
_tx_decoder = msgspec.msgpack.Decoder(TxBody)
_rec_decoder = msgspec.msgpack.Decoder(RecordImage)
_manifest_decoder = msgspec.json.Decoder(Manifest)
_json_encoder = msgspec.json.Encoder()


def check_key(key: str) -> None:
    raw = key.encode()
    if not raw or len(raw) > MAX_KEY_BYTES or not _KEY_RE.match(key):
        raise InvalidKeyError(f"invalid record key {key!r}: 1-{MAX_KEY_BYTES} bytes of [A-Za-z0-9._:@#/+=-]")


def record_file_name(key: str) -> str:
    return key.encode().hex() + ".rec"


def key_from_file_name(name: str) -> str:
    try:
        return bytes.fromhex(name[:-4]).decode()
    except ValueError as exc:
        raise StoreCorruptError(f"record file name {name!r} is not a hex key") from exc


def encode_tx(ops: tuple[Op, ...]) -> bytes:
    return _tx_encoder.encode(TxBody(ops))


def decode_tx(payload: bytes | memoryview) -> TxBody:
    try:
        return _tx_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise StoreCorruptError(f"undecodable transaction: {exc}") from None


def encode_record(image: RecordImage) -> bytes:
    body = RECORD_MAGIC + _tx_encoder.encode(image)
    return body + _U64.pack(xxhash.xxh3_64_intdigest(body))


def decode_record(data: bytes, name: str, key: str | None = None) -> RecordImage:
    """The record a file holds, checked: magic, checksum, and that it holds the key its name
    says (``key``: that key, when the caller already knows it)."""
    if len(data) < len(RECORD_MAGIC) + 8 or not data.startswith(RECORD_MAGIC):
        raise StoreCorruptError(f"record file {name}: bad magic or truncated")
    view = memoryview(data)  # no copy of the body for the checksum or the decoder
    if xxhash.xxh3_64_intdigest(view[:-8]) != _U64.unpack_from(data, len(data) - 8)[0]:
        raise StoreCorruptError(f"record file {name}: checksum mismatch")
    try:
        image = _rec_decoder.decode(view[len(RECORD_MAGIC) : -8])
    except msgspec.DecodeError as exc:
        raise StoreCorruptError(f"record file {name}: {exc}") from None
    if (image.key != key) if key is not None else (record_file_name(image.key) != name):
        raise StoreCorruptError(f"record file {name}: holds key {image.key!r}")
    return image


def manifest_checksum(manifest: Manifest) -> str:
    """The checksum a MANIFEST carries: XXH3-128 of its encoding with ``checksum`` empty."""
    body = _json_encoder.encode(msgspec.structs.replace(manifest, checksum=""))
    return xxhash.xxh3_128_hexdigest(body)


def seal_manifest(manifest: Manifest) -> Manifest:
    """``manifest`` carrying its checksum (every MANIFEST this build writes is sealed)."""
    return msgspec.structs.replace(manifest, checksum=manifest_checksum(manifest))


def encode_manifest(manifest: Manifest) -> bytes:
    """The bytes of ``manifest``, sealed with its checksum."""
    if len(manifest.generation.encode()) > MAX_GENERATION_BYTES:
        raise ValueError("manifest generation id exceeds 256 bytes")
    data = _json_encoder.encode(seal_manifest(manifest))
    if len(data) > MAX_MANIFEST_BYTES:
        raise ValueError("manifest exceeds 1 MiB")
    return data


def decode_manifest(data: bytes) -> Manifest:
    try:
        manifest = _manifest_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise StoreCorruptError(f"MANIFEST: {exc}") from None
    if manifest.format not in (FORMAT, FORMAT_V4, FORMAT_V3):
        raise StoreCorruptError(f"MANIFEST: format {manifest.format!r}, expected {FORMAT!r}")
    if manifest.format != FORMAT_V3 and (not manifest.record_digest or not manifest.secret_check):
        raise StoreCorruptError(
            f"MANIFEST: a {manifest.format} manifest must carry record_digest and secret_check"
        )
    if manifest.catalog and manifest.format != FORMAT:
        raise StoreCorruptError(f"MANIFEST: a {manifest.format} manifest names no catalog")
    if len(manifest.generation.encode()) > MAX_GENERATION_BYTES:
        raise StoreCorruptError("MANIFEST: generation id exceeds 256 bytes")
    if manifest.checkpoint_lsn < 0 or manifest.wal_start_seq < 1:
        raise StoreCorruptError("MANIFEST: negative lsn or sequence")
    return manifest

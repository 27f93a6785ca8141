"""Property tests for every decoder that reads outside input: whatever bytes arrive, each
raises only its documented error type (or succeeds), never an IndexError, a UnicodeError, a
RecursionError or anything else a caller would not expect.

Inputs are mostly valid encodings with bytes flipped, cut or inserted, plus raw noise, so
the decoders are driven past their first checks. ``AFTERWORD_FUZZ_EXAMPLES`` sets the
examples per decoder (default 60); the counts of the last run print at the end of each test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _service import ENV, write_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from afterword.app.operator import encode_cursor
from afterword.app.service import ContinuationService
from afterword.blobs import BlobStore
from afterword.config import ConfigError, load_config
from afterword.config.load import config_from_mapping
from afterword.continuations.capabilities import (
    claim_token,
    operator_token,
    parse_claim_token,
    result_token,
    verify_operator_token,
    verify_result_token,
)
from afterword.continuations.errors import ContinuationError, InvalidRequest, Unauthorized
from afterword.disk import StateRoot
from afterword.http.app import decode_json
from afterword.legacy.formats import V1_FILE, V2_DIR, MigrationError, read_v1, read_v2
from afterword.protocol.wire import (
    ClaimRequest,
    DetachedClaimRequest,
    ResolveRequest,
    ResultRequest,
    RetryRequest,
)
from afterword.store import RecordStore
from afterword.store.codec import (
    RECORD_MAGIC,
    Manifest,
    Op,
    RecordImage,
    decode_manifest,
    decode_record,
    decode_tx,
    encode_manifest,
    encode_record,
    encode_tx,
    record_file_name,
)
from afterword.store.errors import StoreCorruptError
from afterword.wal.errors import WalCorruptError
from afterword.wal.layout import SegmentHeader, encode_frame, encode_segment_header
from afterword.wal.scan import SegmentImage, scan_chain

EXAMPLES = int(os.environ.get("AFTERWORD_FUZZ_EXAMPLES", "60"))
pytestmark = pytest.mark.timeout(max(120, EXAMPLES // 2))  # a long run needs longer
fuzz = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
KEY = b"k" * 32

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid encoding with a few bytes flipped, a cut or an insertion; sometimes noise."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=512))
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["flip", "cut", "insert", "none"]))
        if action == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
        elif action == "cut" and data:
            data = data[: draw(st.integers(0, len(data) - 1))]
        elif action == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


class Counter:
    def __init__(self, name: str) -> None:
        self.name = name
        self.examples = 0
        self.accepted = 0

    def report(self) -> None:
        print(f"\nfuzz {self.name}: {self.examples} examples, {self.accepted} accepted as valid")


# -- WAL frames and segment scan ---------------------------------------------------------------
SALT = 0x1234
SEG = 4096


def _segment(seq: int, payloads: list[bytes]) -> bytes:
    data = bytearray(encode_segment_header(SegmentHeader(seq, SALT, 1)))
    lsn = 1
    for p in payloads:
        data += encode_frame(SALT, lsn, lsn, p)
        lsn += 1
    return bytes(data.ljust(SEG, b"\x00"))


segments = st.lists(st.binary(max_size=64), max_size=4).map(lambda ps: _segment(1, ps))


def test_wal_scan_raises_only_wal_corrupt_error() -> None:
    count = Counter("WAL segment scan")

    @fuzz
    @given(st.lists(mutated(segments), min_size=1, max_size=3))
    def run(images: list[bytes]) -> None:
        count.examples += 1
        try:
            scan_chain(
                [SegmentImage(i, data) for i, data in enumerate(images)],
                start_seq=1,
                checkpoint_lsn=0,
                max_payload=1024,
            )
            count.accepted += 1
        except WalCorruptError:
            pass

    run()
    count.report()


# -- record codec, transactions, MANIFEST ------------------------------------------------------
records = st.builds(
    lambda key, lsn, value: encode_record(RecordImage(key=key, lsn=lsn, value=value)),
    st.from_regex(r"[a-z]{1,8}/[a-z0-9]{1,8}", fullmatch=True),
    st.integers(0, 2**40),
    st.binary(max_size=64),
)


def test_record_codec_raises_only_store_corrupt_error() -> None:
    count = Counter("record codec")

    @fuzz
    @given(mutated(records), st.sampled_from(["match", "other"]))
    def run(data: bytes, name_kind: str) -> None:
        count.examples += 1
        name = record_file_name("a/b") if name_kind == "other" else _name_of(data)
        try:
            decode_record(data, name)
            count.accepted += 1
        except StoreCorruptError:
            pass

    run()
    count.report()


def _name_of(data: bytes) -> str:
    try:
        return record_file_name(msgspec.msgpack.decode(data[len(RECORD_MAGIC) : -8])[0])
    except Exception:
        return record_file_name("x/y")


def test_transaction_codec_raises_only_store_corrupt_error() -> None:
    count = Counter("transaction codec")
    ops = st.builds(Op, key=st.just("a/b"), value=st.binary(max_size=16) | st.none())
    txs = st.lists(ops, max_size=3).map(lambda ops: encode_tx(tuple(ops)))

    @fuzz
    @given(mutated(txs))
    def run(data: bytes) -> None:
        count.examples += 1
        try:
            decode_tx(data)
            count.accepted += 1
        except StoreCorruptError:
            pass

    run()
    count.report()


def test_manifest_raises_only_store_corrupt_error() -> None:
    count = Counter("MANIFEST")
    manifests = st.builds(
        lambda gen, lsn, seq: encode_manifest(_manifest(gen, lsn, seq)),
        st.text(max_size=40),
        st.integers(0, 2**40),
        st.integers(1, 2**20),
    )

    @fuzz
    @given(mutated(manifests) | st.builds(lambda v: json.dumps(v).encode(), json_values))
    def run(data: bytes) -> None:
        count.examples += 1
        try:
            decode_manifest(data)
            count.accepted += 1
        except StoreCorruptError:
            pass

    run()
    count.report()


def _manifest(generation: str, lsn: int, seq: int) -> Manifest:
    return Manifest(generation=generation, checkpoint_lsn=lsn, wal_start_seq=seq, record_count=lsn % 7)


# -- configuration -----------------------------------------------------------------------------
def test_config_loader_raises_only_config_error(tmp_path: Path) -> None:
    count = Counter("config loader")
    good = write_config(tmp_path).read_bytes()
    doc = json.loads(good)
    path = tmp_path / "fuzzed.json"

    @fuzz
    @given(mutated(st.just(good)) | st.builds(lambda v: json.dumps(v).encode(), json_values))
    def run(data: bytes) -> None:
        count.examples += 1
        path.write_bytes(data)
        try:
            load_config(path, environ=ENV)
            count.accepted += 1
        except ConfigError:
            pass

    @fuzz
    @given(st.sampled_from(sorted(doc["continuations"])), json_values)
    def run_fields(field: str, value: Any) -> None:
        count.examples += 1
        try:
            config_from_mapping(
                {**doc, "continuations": {**doc["continuations"], field: value}}, str(tmp_path), environ=ENV
            )
            count.accepted += 1
        except ConfigError:
            pass

    run()
    run_fields()
    count.report()


# -- legacy v1/v2 readers ----------------------------------------------------------------------
def test_legacy_readers_raise_only_migration_error(tmp_path: Path) -> None:
    count = Counter("legacy v1/v2 readers")
    os.chmod(tmp_path, 0o700)
    root = StateRoot(str(tmp_path / "legacy"))
    legacy = Path(root.path("."))
    (legacy / V2_DIR).mkdir(mode=0o700, exist_ok=True)
    record = {
        "id": "c_1",
        "state": "claimed",
        "serverName": "s",
        "kind": "detached",
        "mode": "silent",
        "taskKey": "k",
        "taskHash": "h",
        "deadline": "2030-01-01T00:00:00.000Z",
        "createdAt": "2026-01-01T00:00:00.000Z",
        "updatedAt": "2026-01-01T00:00:00.000Z",
    }
    v1 = json.dumps({"format": "monolith-v1", "records": [record]}).encode()
    v2 = json.dumps({**record, "format": "records-v2"}).encode()

    @fuzz
    @given(
        mutated(st.just(v1)) | st.builds(lambda v: json.dumps(v).encode(), json_values), mutated(st.just(v2))
    )
    def run(one: bytes, two: bytes) -> None:
        count.examples += 1
        for f in (legacy / V2_DIR).iterdir():
            f.unlink()
        (legacy / V1_FILE).write_bytes(one)
        os.chmod(legacy / V1_FILE, 0o600)
        (legacy / V2_DIR / "c_1.json").write_bytes(two)
        os.chmod(legacy / V2_DIR / "c_1.json", 0o600)
        for reader in (read_v1, read_v2):
            try:
                reader(root)
                count.accepted += 1
            except MigrationError:
                pass

    run()
    count.report()


# -- cursors and tokens (through the service that checks them) ---------------------------------
@pytest.fixture
def service(tmp_path: Path) -> Any:
    config = load_config(write_config(tmp_path), environ=ENV)
    store = RecordStore.open(config.state_dir)
    try:
        yield ContinuationService(config, store, BlobStore(store.root, store.secret), environ=ENV)
    finally:
        store.close()


def test_cursor_decoding_raises_only_invalid_request(service: ContinuationService) -> None:
    count = Counter("operator cursor")
    real = encode_cursor(service._keys.cursor, (1_700_000_000_000, "c_abc"))
    cursors = mutated(st.just(real.encode())).map(lambda b: b.decode("utf-8", "replace")) | st.text(
        max_size=80
    )

    @fuzz
    @given(cursors)
    def run(cursor: str) -> None:
        count.examples += 1
        try:
            service.list_continuations(cursor=cursor)
            count.accepted += 1
        except InvalidRequest:
            pass

    run()
    count.report()


def test_token_parsing_raises_only_unauthorized(service: ContinuationService) -> None:
    count = Counter("token parsing")
    samples = [
        claim_token(KEY, "cap-1"),
        result_token(KEY, "c_1"),
        operator_token(KEY),
        service.operator_token(),
        result_token(service._keys.result, "c_1"),
        "x",
    ]
    tokens = st.sampled_from(samples).flatmap(lambda t: mutated(st.just(t.encode()))).map(
        lambda b: b.decode("utf-8", "replace")
    ) | st.text(max_size=120)

    @fuzz
    @given(tokens, st.text(max_size=20))
    def run(token: str, name: str) -> None:
        count.examples += 1
        assert parse_claim_token(KEY, token) in (None, "cap-1")
        assert isinstance(verify_result_token(KEY, "c_1", token), bool)
        assert isinstance(verify_operator_token(KEY, token), bool)
        for check in (
            lambda: service.verify_operator(token),
            lambda: service.authenticate_claim(token),
            lambda: service.authenticate_result("c_1", token),
            lambda: service.authenticate_detached(name or "work-control", token),
        ):
            try:
                check()
                count.accepted += 1
            except Unauthorized:
                pass

    run()
    count.report()


# -- request bodies ----------------------------------------------------------------------------
BODY_TYPES = (ClaimRequest, DetachedClaimRequest, ResultRequest, ResolveRequest, RetryRequest)


def _valid_body(kind: type) -> bytes:
    return {
        ClaimRequest: b'{"taskKey":"k","taskHash":"h","deadline":"2030-01-01T00:00:00.000Z"}',
        DetachedClaimRequest: b'{"route":"r","taskKey":"k","taskHash":"h","deadline":"2030-01-01T00:00:00.000Z"}',
        ResultRequest: b'{"idempotencyKey":"k","payloadHash":"h","payload":{"a":[1,2,{"b":null}]}}',
        ResolveRequest: b'{"kind":"delivered","deliveryId":"d"}',
        RetryRequest: b'{"allowUnknown":true}',
    }[kind]


def test_request_bodies_raise_only_invalid_request() -> None:
    count = Counter("request bodies")
    nested = st.integers(1, 3000).map(lambda n: b'{"payload":' + b"[" * n + b"]" * n + b"}")
    bodies = st.sampled_from(BODY_TYPES).flatmap(
        lambda k: st.tuples(
            st.just(k),
            mutated(st.just(_valid_body(k)))
            | nested
            | st.builds(lambda v: json.dumps(v).encode(), json_values),
        )
    )

    @fuzz
    @given(bodies)
    def run(case: tuple[type, bytes]) -> None:
        kind, data = case
        count.examples += 1
        try:
            decode_json(kind, data)
            count.accepted += 1
        except InvalidRequest:
            pass
        except ContinuationError as exc:  # any other typed error would be a wrong status
            raise AssertionError(f"{type(exc).__name__} for a body") from exc

    run()
    count.report()

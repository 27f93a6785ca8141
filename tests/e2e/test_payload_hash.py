"""One canonical payload hash (issue 28, point 4): RFC 8785 (JSON Canonicalization Scheme) in
the server, the Python producer, the TypeScript client and ``afterword payload-hash``, checked
against each other and against Node's own number formatting.

The Node half needs node >= 20 and the TypeScript client's node_modules (as
tests/e2e/test_host_clients.py: skipped without them, a failure under ``CI=true``).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
import struct
import subprocess
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _node import TS
from fakes.harness import make_config, running
from fakes.producer import settle

from afterword.cli import main as cli_main
from afterword.clients.producer import payload_hash
from afterword.continuations.errors import InvalidRequest
from afterword.continuations.jcs import NotCanonical, canonical_json
from afterword.continuations.rules import check_result

# Values whose canonical text the sorted-JSON recipe got wrong, and the edges of the layout.
NUMBERS: list[tuple[float, str]] = [
    (1e300, "1e+300"),
    (1e-7, "1e-7"),
    (1e16, "10000000000000000"),
    (1e20, "100000000000000000000"),
    (1e21, "1e+21"),
    (123e18, "123000000000000000000"),
    (1.5e21, "1.5e+21"),
    (-0.0, "0"),
    (5e-324, "5e-324"),
    (2.2250738585072014e-308, "2.2250738585072014e-308"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (0.000001, "0.000001"),
    (0.0000001234, "1.234e-7"),
    (2.0, "2"),
    (0.1 + 0.2, "0.30000000000000004"),
    (9007199254740993.0, "9007199254740992"),
    (-1e-300, "-1e-300"),
]
STRINGS = ["", "\u20ac", "\U0001f600", "a\u2028b", "\x7f", "\x00\x1f\b\t\n\f\r", '"\\/', "</script>"]


def _sha(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


# -- the Python implementation ---------------------------------------------------------------
@pytest.mark.parametrize(("value", "text"), NUMBERS)
def test_numbers_are_written_as_ecmascript_writes_them(value: float, text: str) -> None:
    assert canonical_json(value) == text.encode()
    assert canonical_json([value]) == f"[{text}]".encode()


def test_members_sort_by_utf16_code_units_and_strings_escape_only_what_json_needs() -> None:
    value = {"\ufb33": 2, "\U0001f600": 1, "b": [True, None], "a": '\u20ac\n\x1f"\\\x7f'}
    expected = '{"a":"\u20ac\\n\\u001f\\"\\\\\x7f","b":[true,null],"\U0001f600":1,"\ufb33":2}'
    assert canonical_json(value) == expected.encode()
    # Python's own order (code points) puts U+FB33 first; UTF-16 order puts the emoji first.
    assert sorted(value)[2] == "\ufb33"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (2**53, "9007199254740992"),
        (-(2**53), "-9007199254740992"),
        (10**21, "1e+21"),
        (1152921504606847000, "1152921504606847000"),
    ],
)
def test_an_integer_a_double_prints_back_unchanged_is_accepted(value: int, text: str) -> None:
    assert canonical_json(value) == text.encode()


@pytest.mark.parametrize(
    "value",
    [
        2**53 + 1,
        2**60,
        12345678901234567891,
        10**400,
        math.nan,
        math.inf,
        "\ud800",
        {"\udc00": 1},
        {1: 2},
        b"x",
    ],
)
def test_a_value_without_a_canonical_form_is_refused(value: Any) -> None:
    with pytest.raises(NotCanonical):
        canonical_json(value)


def test_deep_nesting_meets_no_recursion_limit() -> None:
    value: Any = 0
    for _ in range(5000):
        value = [value]
    assert canonical_json(value) == b"[" * 5000 + b"0" + b"]" * 5000


# -- what the service accepts ------------------------------------------------------------------
FLOATY = {"ratio": 1e-7, "big": 1e300, "n": 1e16, "z": -0.0, "tiny": 5e-324, "x": [2.0, 0.5]}


def test_the_service_accepts_the_rfc8785_hash_and_keeps_the_bytes_it_covers() -> None:
    canonical = check_result("k", _sha(canonical_json(FLOATY)), FLOATY, 100)
    assert canonical == b'{"big":1e+300,"n":10000000000000000,"ratio":1e-7,"tiny":5e-324,"x":[2,0.5],"z":0}'


def test_the_service_still_accepts_the_older_sorted_hash_of_the_same_payload() -> None:
    legacy = msgspec.json.encode(FLOATY, order="sorted")
    assert check_result("k", _sha(legacy), FLOATY, 100) == legacy
    with pytest.raises(InvalidRequest, match="RFC 8785"):
        check_result("k", _sha(legacy + b" "), FLOATY, 100)


def test_a_big_integer_is_refused_under_rfc8785_but_the_older_form_still_covers_it() -> None:
    payload = {"id": 12345678901234567891}
    with pytest.raises(InvalidRequest, match="as a string"):
        check_result("k", "0" * 64, payload, 100)
    legacy = msgspec.json.encode(payload, order="sorted")
    assert check_result("k", _sha(legacy), payload, 100) == legacy


@pytest.mark.anyio
async def test_a_producer_following_the_docs_gets_its_float_payload_accepted_and_a_repeat_in_the_other_form_is_the_same(
    tmp_path: Path,
) -> None:
    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        binding = h.service.begin_run("run-1", "local:c", "local:c", "reply")
        claimed = await h.producer.claim(binding, "task-1")
        await settle(binding)

        async def put(digest: str) -> int:
            body = {"idempotencyKey": "r-1", "payloadHash": digest, "payload": FLOATY}
            r = await h.producer.client.put(
                claimed.result_url, headers={"Authorization": f"Bearer {claimed.token}"}, json=body
            )
            return r.status_code

        assert await put(_sha(canonical_json(FLOATY))) == 200
        assert await put(_sha(msgspec.json.encode(FLOATY, order="sorted"))) == 200  # same result
        rec = h.service.repo.get(claimed.id)
        assert rec is not None and rec.result is not None
        assert rec.result.payload_hash == _sha(canonical_json(FLOATY))


def test_the_python_producer_hashes_with_rfc8785() -> None:
    assert payload_hash(FLOATY) == _sha(canonical_json(FLOATY))
    with pytest.raises(ValueError):
        payload_hash({"n": math.nan})


# -- the command -------------------------------------------------------------------------------
def _cli(
    data: bytes, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    code = cli_main(["payload-hash"])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_prints_the_hash_of_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = _cli(b'{"big": 1e300, "ratio": 1E-7, "n": 1e16}\n', capsys, monkeypatch)
    assert (code, err) == (0, "")
    assert out == _sha(b'{"big":1e+300,"n":10000000000000000,"ratio":1e-7}') + "\n"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'{"a": 1,', "not one JSON value"),
        (b"", "not one JSON value"),
        (b'{"a": 1, "a": 2}', "repeats the key"),
        (b"[12345678901234567891]", "as a string"),
        (b'"\\udc00"', "not one JSON value"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line(
    data: bytes, why: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = _cli(data, capsys, monkeypatch)
    assert code != 0 and out == ""
    assert why in err and err.count("\n") == 1


# -- against Node --------------------------------------------------------------------------------
def _random_doubles(count: int) -> list[float]:
    rng = random.Random(8785)
    values: list[float] = []
    while len(values) < count:
        value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(value):
            values.append(value)
    # Plus every power of ten at the layout boundaries, and numbers near them.
    for e in range(-30, 30):
        values += [10.0**e, 1.5 * 10.0**e, -(10.0**e), math.nextafter(10.0**e, math.inf)]
    return values


def _node_eval(node_bin: str, script: str, stdin: str) -> Any:
    done = subprocess.run(
        [node_bin, "--input-type=module", "-e", script],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=TS,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


def test_python_and_the_typescript_client_agree(node: str) -> None:
    numbers = _random_doubles(3000) + [v for v, _ in NUMBERS]
    payloads: list[Any] = [
        FLOATY,
        {s: s for s in STRINGS},
        [{"\U0001f600": 1, "\ufb33": 2, "\u00e9": 3, "e": 4, "": 5}],
        {"nested": {"b": [1, {"y": None, "x": False}], "a": "\u0000"}},
        # Integers a double holds exactly: Node reads them as those doubles, Python keeps ints.
        [2**53, -(2**53), 1152921504606847000, 10**21, 123e18, 0, -1],
        numbers,
    ]
    script = (
        'import { canonicalJson, payloadHash } from "./dist/src/index.js";\n'
        'import { readFileSync } from "node:fs";\n'
        "const payloads = JSON.parse(readFileSync(0, 'utf8'));\n"
        "process.stdout.write(JSON.stringify({\n"
        "  texts: payloads.map((p) => canonicalJson(p)),\n"
        "  hashes: payloads.map((p) => payloadHash(p)),\n"
        "  numbers: payloads[payloads.length - 1].map((n) => canonicalJson(n)),\n"
        "}));\n"
    )
    # msgspec writes each double as its shortest round-trip digits, which JSON.parse reads back exactly.
    seen = _node_eval(node, script, msgspec.json.encode(payloads).decode())
    assert seen["numbers"] == [canonical_json(v).decode() for v in numbers]
    assert seen["texts"] == [canonical_json(p).decode() for p in payloads]
    assert seen["hashes"] == [payload_hash(p) for p in payloads]


def test_node_number_tostring_is_the_reference_for_the_layout(node: str) -> None:
    numbers = _random_doubles(500)
    seen = _node_eval(
        node,
        "import { readFileSync } from 'node:fs';\n"
        "process.stdout.write(JSON.stringify(JSON.parse(readFileSync(0, 'utf8')).map((n) => String(n))));\n",
        msgspec.json.encode(numbers).decode(),
    )
    assert seen == [canonical_json(v).decode() for v in numbers]


@pytest.mark.anyio
async def test_a_large_payload_is_canonicalized_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from afterword.app import results

    threads: list[str] = []

    def recording(*args: Any) -> bytes:
        threads.append(threading.current_thread().name)
        return check_result(*args)

    monkeypatch.setattr(results, "check_result", recording)
    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        for run, size in (("run-small", 10), ("run-large", results.CANONICAL_ON_THREAD_FROM)):
            binding = h.service.begin_run(run, "local:c", "local:c", "reply")
            claimed = await h.producer.claim(binding, "task-" + run)
            await settle(binding)
            payload = {"summary": "x" * size, "scores": [0.1 * i for i in range(size // 64)]}
            body = {"idempotencyKey": "r-1", "payloadHash": payload_hash(payload), "payload": payload}
            r = await h.producer.client.put(
                claimed.result_url, headers={"Authorization": f"Bearer {claimed.token}"}, json=body
            )
            assert r.status_code == 200, r.text
    loop_thread = threading.main_thread().name
    assert threads[0] == loop_thread and threads[1] != loop_thread

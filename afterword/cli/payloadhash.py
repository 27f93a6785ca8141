"""``afterword payload-hash``: the ``payloadHash`` of a JSON payload read on stdin.

The same rules the service applies to a result (docs/payload-hash.md): the
payload must be a body the service would decode (no repeated key, not nested too deep), and
the hash is sha256 of its RFC 8785 canonical JSON.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from ..continuations.errors import InvalidRequest
from ..continuations.jcs import NotCanonical
from ..continuations.rules import payload_hash
from ..http.strictjson import check_body
from .common import CliError


def add_payload_hash_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "payload-hash",
        help="print the payloadHash of the JSON payload on stdin",
        description="Read one JSON value on stdin and print its payloadHash: the lowercase hex "
        "sha256 of its RFC 8785 (JSON Canonicalization Scheme) form, which a result submission "
        "must carry. Exits 1 with one line on stderr when stdin is not such a value.",
    )
    parser.set_defaults(func=cmd_payload_hash)


def cmd_payload_hash(args: argparse.Namespace) -> int:
    data = sys.stdin.buffer.read()
    try:
        check_body(data)
        payload = msgspec.json.decode(data)
        digest = payload_hash(payload)
    except (InvalidRequest, NotCanonical) as exc:
        raise CliError(f"payload-hash: {exc}", kind="invalid_payload") from None
    except msgspec.DecodeError as exc:
        raise CliError(f"payload-hash: stdin is not one JSON value: {exc}", kind="invalid_payload") from None
    print(digest)
    return 0

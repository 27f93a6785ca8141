"""Checks a request body must pass before msgspec decodes it: bounded nesting, unique keys.

msgspec decodes recursively, so a body nested a thousand levels deep raises
``RecursionError``; and like most JSON parsers it lets a repeated key silently replace the
first (``"route"`` twice would select a different route than a reviewer reading the body
sees). Both are refused here with :class:`InvalidRequest`, the documented 400.
"""

from __future__ import annotations

import json
import re

from ..config.jsonfile import DuplicateKeyError, unique_object_pairs
from ..continuations.errors import InvalidRequest

MAX_JSON_DEPTH = 64
"""Arrays and objects may nest at most this deep in a request body (the body itself is 1)."""

# A JSON string, written as an unrolled loop so the engine never backtracks.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(data: bytes) -> int:
    """The deepest array/object nesting in ``data``, ignoring brackets inside strings.

    Stops counting once ``MAX_JSON_DEPTH`` is exceeded, so a hostile body costs one pass."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for b in brackets:
        if b in b"[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    break
        else:
            depth -= 1
    return deepest


def check_body(data: bytes) -> None:
    """Raise :class:`InvalidRequest` if ``data`` nests too deep or repeats a key in an object.

    Other syntax errors are left to the typed decoder, which reports them with a JSON path."""
    if nesting_depth(data) > MAX_JSON_DEPTH:
        raise InvalidRequest(f"body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        json.loads(data, object_pairs_hook=unique_object_pairs)
    except DuplicateKeyError as exc:
        shown = exc.key if len(exc.key) <= 64 else exc.key[:64] + "..."
        raise InvalidRequest(f"body repeats the key {json.dumps(shown)}") from None
    except (ValueError, RecursionError):
        return  # not JSON at all: the typed decoder says so

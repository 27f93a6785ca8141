"""RFC 8785, the JSON Canonicalization Scheme: the bytes ``payloadHash`` covers.

One canonical text per JSON value, so a producer in any language can compute the hash:
object members sorted by the UTF-16 code units of their names, no whitespace, strings with
only the escapes JSON requires, and numbers written as ECMAScript's ``Number.prototype.toString``
writes the IEEE double they denote. The same rules live in the TypeScript client
(clients/typescript/src/canonical.ts); docs/payload-hash.md has the contract.

Pure (stdlib only), and iterative, so a payload nested as deep as the decoder allows does not
meet Python's recursion limit.
"""

from __future__ import annotations

import math
from decimal import Decimal
from json.encoder import encode_basestring  # escapes exactly what RFC 8785 escapes

from ..errors import CallerError

__all__ = ["NotCanonical", "canonical_json", "number_text"]

_SAFE_INT = 2**53


class NotCanonical(CallerError, ValueError):
    """The value has no RFC 8785 form: a non-finite float, an integer no double holds as
    written, a lone surrogate, a non-string key, or a type JSON does not have."""


class _Token(str):
    """Punctuation queued for output, told apart from a string value still to encode."""


_OPEN_ARRAY, _CLOSE_ARRAY = _Token("["), _Token("]")
_OPEN_OBJECT, _CLOSE_OBJECT = _Token("{"), _Token("}")
_COMMA = _Token(",")


def number_text(value: float) -> str:
    """A finite double as ECMAScript's ``Number.prototype.toString`` writes it.

    Python's ``repr`` already gives the shortest digits that read back as the same double
    (ties to the nearer value, as ECMAScript requires); only the layout differs.
    """
    if value == 0:
        return "0"  # -0 too
    if value < 0:
        return "-" + number_text(-value)
    mantissa, _, exponent = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + (int(exponent) if exponent else 0)  # value = 0.<digits> * 10**point
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    e = n - 1
    sign = "+" if e >= 0 else "-"
    head = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{sign}{abs(e)}"


def _int_text(value: int) -> str:
    if -_SAFE_INT <= value <= _SAFE_INT:
        return str(value)
    # Beyond 2**53 the canonical text is the double's; it must still denote this very integer,
    # or hashing would silently stand for a different number than the one sent.
    try:
        text = number_text(float(value))
    except OverflowError:
        text = ""
    if not text or Decimal(text) != value:
        raise NotCanonical(f"integer {value} is not exactly an IEEE double as written; send it as a string")
    return text


def _key(name: object) -> bytes:
    if not isinstance(name, str):
        raise NotCanonical(f"object member names must be strings, got {type(name).__name__}")
    try:
        return name.encode("utf-16-be")  # byte order equals UTF-16 code unit order
    except UnicodeEncodeError:
        raise NotCanonical("an object member name holds a lone surrogate") from None


def canonical_json(value: object) -> bytes:
    """The RFC 8785 text of ``value`` (built from dict, list, tuple, str, int, float, bool,
    None), UTF-8 encoded.

    Raises:
        NotCanonical: ``value`` has no canonical form (see the class).
    """
    out: list[str] = []
    todo: list[object] = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, _Token):
            out.append(item)
        elif isinstance(item, str):
            out.append(encode_basestring(item))
        elif item is None:
            out.append("null")
        elif item is True:
            out.append("true")
        elif item is False:
            out.append("false")
        elif isinstance(item, int):
            out.append(_int_text(item))
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise NotCanonical(f"{item} is not a JSON number")
            out.append(number_text(item))
        elif isinstance(item, (list, tuple)):
            todo.append(_CLOSE_ARRAY)
            for index in range(len(item) - 1, -1, -1):
                todo.append(item[index])
                if index:
                    todo.append(_COMMA)
            todo.append(_OPEN_ARRAY)
        elif isinstance(item, dict):
            members = sorted(item.items(), key=lambda member: _key(member[0]))
            todo.append(_CLOSE_OBJECT)
            for index in range(len(members) - 1, -1, -1):
                name, member = members[index]
                todo.append(member)
                todo.append(_Token(encode_basestring(name) + ":"))
                if index:
                    todo.append(_COMMA)
            todo.append(_OPEN_OBJECT)
        else:
            raise NotCanonical(f"{type(item).__name__} is not a JSON value")
    try:
        return "".join(out).encode("utf-8")
    except UnicodeEncodeError:
        raise NotCanonical("a string holds a lone surrogate (not valid Unicode)") from None

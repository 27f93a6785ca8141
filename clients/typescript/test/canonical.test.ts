// RFC 8785 canonical JSON and the payloadHash built on it: the cases where a hand-rolled
// "sorted compact JSON" differs (number layout, key order by UTF-16 code units, escapes).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";

import { canonicalJson, payloadHash } from "../src/index.js";

test("numbers are written as ECMAScript writes the double", () => {
  const cases: Array<[number, string]> = [
    [1e300, "1e+300"],
    [1e-7, "1e-7"],
    [1e16, "10000000000000000"],
    [1e20, "100000000000000000000"],
    [1e21, "1e+21"],
    [-0, "0"],
    [5e-324, "5e-324"],
    [0.000001, "0.000001"],
    [2.0, "2"],
    [-1.7976931348623157e308, "-1.7976931348623157e+308"],
    [333333333.3333333, "333333333.3333333"],
  ];
  for (const [value, expected] of cases) assert.equal(canonicalJson(value), expected);
});

test("members sort by UTF-16 code units; strings keep only the escapes JSON needs", () => {
  const value = { "\uFB33": 2, "\u{1F600}": 1, b: [true, null], a: "\u20AC\n\u001F\"\\\u007F" };
  assert.equal(canonicalJson(value), '{"a":"\u20AC\\n\\u001f\\"\\\\\u007F","b":[true,null],"\u{1F600}":1,"\uFB33":2}');
});

test("payloadHash is sha256 of the canonical text", () => {
  const payload = { b: 1e300, a: [1e-7, 1e16] };
  const expected = createHash("sha256").update('{"a":[1e-7,10000000000000000],"b":1e+300}').digest("hex");
  assert.equal(payloadHash(payload), expected);
});

test("values without a canonical form are refused", () => {
  for (const bad of [NaN, Infinity, 10n, "\uD800", { "\uDC00": 1 }, undefined, new Date(0)]) {
    assert.throws(() => canonicalJson(bad), TypeError);
  }
});

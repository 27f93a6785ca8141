// The payloadHash of a result: sha256 of the payload's RFC 8785 canonical JSON (the JSON
// Canonicalization Scheme), the same rules as the server's afterword/continuations/jcs.py and the
// `afterword payload-hash` command (docs/payload-hash.md).
import { createHash } from "node:crypto";

// A UTF-16 surrogate without its partner: not Unicode text, so it has no UTF-8 form to hash.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function text(value: string): string {
  if (LONE_SURROGATE.test(value)) {
    throw new TypeError("a string holds a lone surrogate (not valid Unicode)");
  }
  return JSON.stringify(value); // escapes exactly what RFC 8785 escapes
}

function write(value: unknown, out: string[]): void {
  if (value === null) {
    out.push("null");
  } else if (typeof value === "boolean") {
    out.push(value ? "true" : "false");
  } else if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new TypeError(`${value} is not a JSON number`);
    out.push(JSON.stringify(value)); // Number.prototype.toString, with -0 as "0"
  } else if (typeof value === "string") {
    out.push(text(value));
  } else if (Array.isArray(value)) {
    out.push("[");
    value.forEach((item: unknown, index: number) => {
      if (index) out.push(",");
      write(item, out);
    });
    out.push("]");
  } else if (typeof value === "object" && Object.getPrototypeOf(value) === Object.prototype) {
    // Default string order compares UTF-16 code units, as RFC 8785 sorts member names. A member
    // whose value is undefined is left out, as JSON.stringify leaves it out of the body sent.
    const entries = Object.entries(value as Record<string, unknown>).filter(([, v]) => v !== undefined);
    entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    out.push("{");
    entries.forEach(([name, member], index) => {
      if (index) out.push(",");
      out.push(text(name), ":");
      write(member, out);
    });
    out.push("}");
  } else {
    // bigint included: an integer beyond 2**53 must travel as a string (the server refuses one
    // that no IEEE double holds as written).
    throw new TypeError(`${typeof value} is not a JSON value`);
  }
}

/** The RFC 8785 canonical JSON text of a payload (plain objects, arrays, strings, finite numbers, booleans, null). */
export function canonicalJson(value: unknown): string {
  const out: string[] = [];
  write(value, out);
  return out.join("");
}

/** The payloadHash a result submission carries: lowercase hex sha256 of `canonicalJson(payload)` as UTF-8. */
export function payloadHash(payload: unknown): string {
  return createHash("sha256").update(canonicalJson(payload), "utf8").digest("hex");
}

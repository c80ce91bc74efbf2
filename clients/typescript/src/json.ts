// The package's JSON reading, internal: lossless-json does the parsing (strict RFC 8259,
// a SyntaxError for anything that is not JSON) and hands over every number's text, so that
// the server's 64-bit integers (epochs, revisions, sequence numbers, limits) and a token's
// epoch up to 2^64-1 are read exactly, where JSON.parse would round them to a double. This
// wrapper turns lossless-json's plain objects into Maps of their own properties only, so
// that no name of the text reaches a prototype and no inherited field (constructor,
// toString, anything added to Object.prototype) reads as if the text had it.

import { parse } from "lossless-json";

/** A JSON number, as written: read it with {@link u64} or {@link safeInteger}. */
export class JsonNumber {
  constructor(readonly text: string) {}
}

/** A JSON object: a Map of the names the text has, so that no name can reach an object's
 * prototype. A repeated name keeps its last value, as JSON.parse does. */
export type JsonObject = Map<string, Json>;

export type Json = null | boolean | string | JsonNumber | Json[] | JsonObject;

const U64_MAX = (1n << 64n) - 1n;
/** Deeper nesting than this is refused, as are texts too deep for lossless-json's
 * recursion. */
const MAX_DEPTH = 256;

/** Parses one JSON text; throws a SyntaxError where it is not JSON, or where it nests
 * deeper than 256 levels. */
export function parseJson(text: string): Json {
  let parsed: unknown;
  try {
    parsed = parse(text, null, {
      parseNumber: (digits) => new JsonNumber(digits),
      // lossless-json refuses a repeated name with another value by default.
      onDuplicateKey: ({ newValue }) => newValue,
    });
  } catch (err) {
    if (err instanceof RangeError) throw new SyntaxError("not JSON: nested too deep", { cause: err });
    throw err;
  }
  return toJson(parsed, 0);
}

/** lossless-json's reading as a Json: objects become Maps of their own enumerable
 * properties (a "__proto__" name is one, which lossless-json defines as JSON.parse does). */
function toJson(value: unknown, depth: number): Json {
  if (value === null || typeof value === "boolean" || typeof value === "string" || value instanceof JsonNumber) {
    return value;
  }
  if (depth > MAX_DEPTH) throw new SyntaxError("not JSON: nested too deep");
  if (Array.isArray(value)) return value.map((item: unknown) => toJson(item, depth + 1));
  if (typeof value === "object") {
    return new Map(Object.entries(value).map(([name, item]) => [name, toJson(item, depth + 1)]));
  }
  throw new TypeError(`lossless-json returned a ${typeof value}`); // not for any JSON text
}

/** An unsigned 64-bit integer: a JSON number written as a whole number from 0 to
 * 2^64-1 (no sign, fraction or exponent), else undefined. */
export function u64(value: Json | undefined): bigint | undefined {
  if (!(value instanceof JsonNumber) || !/^(?:0|[1-9][0-9]*)$/.test(value.text)) return undefined;
  const n = BigInt(value.text);
  return n <= U64_MAX ? n : undefined;
}

/** A whole number from 0 to 2^53-1, as a JavaScript number, else undefined. */
export function safeInteger(value: Json | undefined): number | undefined {
  const n = u64(value);
  return n !== undefined && n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : undefined;
}

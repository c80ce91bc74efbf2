// Tests of src/json.ts, the wrapper around lossless-json: it reads what JSON.parse reads,
// the same way, and refuses what JSON.parse refuses, with a SyntaxError; integers beyond
// 2^53 are kept exactly; objects are Maps of the names the text has, so neither a
// "__proto__" name nor a field inherited from Object.prototype reads as a field.

import assert from "node:assert/strict";
import { test } from "node:test";

import { type Json, JsonNumber, parseJson, safeInteger, u64 } from "../src/json.js";

/** A reading as JSON.parse would give it (numbers as doubles, objects as objects). The
 * objects are made with defineProperty, so that a "__proto__" name stays a property. */
function plain(value: Json): unknown {
  if (value instanceof JsonNumber) return Number(value.text);
  if (Array.isArray(value)) return value.map(plain);
  if (value instanceof Map) {
    const out = {};
    for (const [name, item] of value) {
      Object.defineProperty(out, name, { value: plain(item), enumerable: true, writable: true, configurable: true });
    }
    return out;
  }
  return value;
}

test("it reads what JSON.parse reads, the same way", () => {
  for (const text of [
    "null",
    " true ",
    "\tfalse\r\n",
    "0",
    "-0",
    "12.5e-3",
    "1E+2",
    '""',
    '"a\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\uD83D\\ude00 é 😀\x7f"',
    '"\\ud800 lone surrogate"',
    "[]",
    "[1, [2, [3]], {}]",
    '{"a":1,"b":[true,null],"c":{"d":"e"}}',
    '{"a":1,"a":2}',
    '{"a":{"b":1},"a":[2],"a":"last"}',
    '{"__proto__":{"x":1}}',
    '{"constructor":1,"toString":"s","hasOwnProperty":null}',
    ' { "l" : "orders" , "e" : 7 } ',
  ]) {
    assert.deepEqual(plain(parseJson(text)), JSON.parse(text), text);
  }
});

test("a repeated name keeps its last value, as JSON.parse does", () => {
  const o = parseJson('{"code":"stale_token","code":"lock_held","n":1,"n":1}') as Map<string, Json>;
  assert.deepEqual([...o.keys()], ["code", "n"]);
  assert.equal(o.get("code"), "lock_held");
});

test("it refuses what JSON.parse refuses, with a SyntaxError", () => {
  for (const text of [
    "",
    " ",
    "01",
    "1.",
    ".5",
    "+1",
    "-",
    "1e",
    "--1",
    "NaN",
    "Infinity",
    "nul",
    "True",
    "[1,]",
    "[1 2]",
    '{"a":1,}',
    '{"a":}',
    "{a:1}",
    '{"a" 1}',
    "'a'",
    '"\\x"',
    '"\\u12"',
    '"\t"',
    '"\u0000"',
    '"open',
    "[",
    "[1] x",
    "{} {}",
    "\ufeff{}",
    "\u00a0{}",
    "// comment\n{}",
  ]) {
    assert.throws(() => JSON.parse(text), SyntaxError, `JSON.parse accepts ${JSON.stringify(text)}`);
    assert.throws(() => parseJson(text), SyntaxError, JSON.stringify(text));
  }
});

test("nesting deeper than 256 levels is refused with a SyntaxError, however deep", () => {
  const nested = (levels: number): string => "[".repeat(levels) + "]".repeat(levels);
  assert.equal(JSON.stringify(plain(parseJson(nested(257)))).length, 2 * 257);
  assert.throws(() => parseJson(nested(258)), SyntaxError);
  // Deep enough to overflow the parser's recursion: still a SyntaxError.
  assert.throws(() => parseJson("[".repeat(200_000)), SyntaxError);
  assert.throws(() => parseJson('{"a":'.repeat(100_000) + "1" + "}".repeat(100_000)), SyntaxError);
});

test("integers are kept exactly, and read only when whole and in range", () => {
  const big = parseJson('{"e":18446744073709551615,"f":9007199254740993}') as Map<string, Json>;
  assert.equal(u64(big.get("e")), 18446744073709551615n);
  assert.equal(u64(big.get("f")), 9007199254740993n);
  assert.equal(safeInteger(big.get("f")), undefined);
  assert.equal(safeInteger(parseJson("9007199254740991")), 9007199254740991);
  assert.equal(u64(parseJson("0")), 0n);
  for (const text of ["18446744073709551616", "-1", "-0", "1.0", "1e3", '"7"', "null", "true", "[7]", '{"e":7}']) {
    assert.equal(u64(parseJson(text)), undefined, text);
  }
  assert.equal(u64(undefined), undefined);
  // The number's text is kept as written, fraction and exponent included.
  assert.deepEqual(parseJson("[-0, 1.50, 2E+3, 123456789012345678901234567890]"), [
    new JsonNumber("-0"),
    new JsonNumber("1.50"),
    new JsonNumber("2E+3"),
    new JsonNumber("123456789012345678901234567890"),
  ]);
});

test("a __proto__ name is an entry of its object, and reaches no prototype", () => {
  const o = parseJson('{"__proto__":{"code":"x"},"error":{"__proto__":{"code":"y"}}}');
  assert.ok(o instanceof Map);
  assert.deepEqual([...o.keys()], ["__proto__", "error"]);
  assert.equal(o.get("code"), undefined);
  const inner = o.get("__proto__");
  assert.ok(inner instanceof Map && inner.get("code") === "x");
  const error = o.get("error");
  assert.ok(error instanceof Map);
  assert.deepEqual([...error.keys()], ["__proto__"]);
  assert.equal(error.get("code"), undefined);
  assert.equal(error.has("code"), false);
  // Nothing leaked into the prototype every object shares.
  assert.equal(Object.hasOwn(Object.prototype, "code"), false);
  assert.equal(({} as Record<string, unknown>).code, undefined);
});

test("no field inherited from Object.prototype reads as a field of the text", () => {
  const empty = parseJson("{}");
  assert.ok(empty instanceof Map);
  for (const name of ["constructor", "toString", "hasOwnProperty", "valueOf", "__proto__", "isPrototypeOf"]) {
    assert.equal(empty.get(name), undefined, name);
    assert.equal(empty.has(name), false, name);
  }
  // Even with Object.prototype polluted by someone else, a name the text lacks is absent.
  Object.defineProperty(Object.prototype, "code", { value: "stale_token", enumerable: true, writable: true, configurable: true });
  try {
    const o = parseJson('{"error":{"message":"m"}}');
    assert.ok(o instanceof Map);
    const error = o.get("error");
    assert.ok(error instanceof Map);
    assert.deepEqual([...error.keys()], ["message"]);
    assert.equal(error.get("code"), undefined);
  } finally {
    Reflect.deleteProperty(Object.prototype, "code");
  }
  assert.equal(Object.hasOwn(Object.prototype, "code"), false);
});

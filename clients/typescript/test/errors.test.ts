// Tests of the typed errors (src/errors.ts): every answer of vectors/errors.json (made
// from the server's own definitions) decodes into its class with its fields, nothing is
// invented for an answer whose fields are missing, of another type, or only under a
// "__proto__" name, and errorOf builds the same errors for refusals made in this process.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  BadRequestError,
  DecodeError,
  HeadersTooLargeError,
  IdempotencyConflictError,
  InvalidTokenError,
  KNOWN_CODES,
  KeyActiveError,
  LeaseExpiredError,
  LockHeldError,
  MethodNotAllowedError,
  MissingTokenError,
  NotFoundError,
  PalisadeError,
  PayloadTooLargeError,
  PermissionDeniedError,
  QuotaExceededError,
  RevisionMismatchError,
  SessionExpiredError,
  StaleSequenceError,
  StaleTokenError,
  StorageFailedError,
  UnauthenticatedError,
  UnavailableError,
  UriTooLongError,
  WriteConflictError,
  WrongLockError,
  errorOf,
  isFenced,
  parseError,
} from "../src/errors.js";
import { vectorsFile } from "./server.js";

type Kind = "bigint" | "number" | "string";
/** A field of the answer: its property on the error, its type, and whether it may be
 * absent or null (then the property is null). */
type Field = [property: string, kind: Kind, optional?: "optional"];

// Each code's class and fields (docs/api.md, "Error codes").
const CODES: Record<string, [new (...args: never[]) => PalisadeError, Record<string, Field>]> = {
  bad_request: [BadRequestError, {}],
  missing_token: [MissingTokenError, {}],
  invalid_token: [InvalidTokenError, {}],
  unauthenticated: [UnauthenticatedError, {}],
  wrong_lock: [WrongLockError, { token_lock: ["tokenLock", "string"] }],
  permission_denied: [PermissionDeniedError, { principal: ["principal", "string", "optional"] }],
  not_found: [NotFoundError, { key_id: ["keyId", "string", "optional"] }],
  lease_expired: [LeaseExpiredError, {}],
  session_expired: [SessionExpiredError, {}],
  method_not_allowed: [MethodNotAllowedError, {}],
  stale_token: [StaleTokenError, { high_water: ["highWater", "bigint"], epoch: ["epoch", "bigint"] }],
  stale_sequence: [
    StaleSequenceError,
    {
      high_water: ["highWater", "bigint"],
      high_water_seq: ["highWaterSeq", "bigint"],
      epoch: ["epoch", "bigint"],
      seq: ["seq", "bigint"],
    },
  ],
  lock_held: [LockHeldError, { holder: ["holder", "string", "optional"], retry_after_ms: ["retryAfterMs", "number"] }],
  key_active: [KeyActiveError, { key_id: ["keyId", "string"] }],
  revision_mismatch: [RevisionMismatchError, { current_revision: ["currentRevision", "bigint", "optional"] }],
  payload_too_large: [PayloadTooLargeError, { limit: ["limit", "bigint", "optional"] }],
  uri_too_long: [UriTooLongError, {}],
  idempotency_conflict: [IdempotencyConflictError, {}],
  headers_too_large: [HeadersTooLargeError, {}],
  quota_exceeded: [QuotaExceededError, { resource: ["resource", "string"], limit: ["limit", "bigint"] }],
  storage_failed: [StorageFailedError, {}],
  unavailable: [UnavailableError, {}],
  write_conflict: [WriteConflictError, {}],
};

// Raised by the gates in the caller's process: no server answer carries it, so
// vectors/errors.json has none (crates/api/src/detail.rs, ErrorDetail::samples).
const LOCAL_CODES = ["write_conflict"];

interface ErrorVectors {
  answers: { status: number; body: { error: Record<string, unknown> & { code: string; message: string } } }[];
}

test("every error answer the server can send decodes into its class with its fields", () => {
  const file = JSON.parse(vectorsFile("errors.json")) as ErrorVectors;
  assert.ok(file.answers.length >= 20, `only ${file.answers.length} answers`);
  const codes = new Set<string>();
  for (const { status, body } of file.answers) {
    const { code, message, ...fields } = body.error;
    codes.add(code);
    const known = CODES[code];
    assert.ok(known !== undefined, `a code this client does not know: ${code}`);
    const [cls, spec] = known;
    const decoded = parseError(status, JSON.stringify(body));
    assert.ok(decoded instanceof PalisadeError, `${code}: ${String(decoded)}`);
    assert.equal(decoded.constructor, cls, `${code} decoded as ${decoded.constructor.name}`);
    assert.deepEqual([decoded.code, decoded.status, decoded.message], [code, status, message]);
    assert.deepEqual(decoded.detail, body.error);
    for (const name of Object.keys(fields)) {
      assert.ok(name in spec, `${code}: the answer has a field this test does not know: ${name}`);
    }
    for (const [name, [property, kind, optional]] of Object.entries(spec)) {
      const raw = fields[name];
      let want: unknown;
      if (raw === undefined || raw === null) {
        assert.ok(optional, `${code}: required field ${name} missing from the vector`);
        want = null;
      } else {
        want = kind === "bigint" ? BigInt(raw as number) : raw;
        assert.equal(typeof raw, kind === "string" ? "string" : "number", `${code}.${name}`);
      }
      assert.equal((decoded as unknown as Record<string, unknown>)[property], want, `${code}.${name}`);
    }
  }
  assert.deepEqual(
    [...codes].sort(),
    Object.keys(CODES).filter((c) => !LOCAL_CODES.includes(c)).sort(),
    "every code the server sends has an answer",
  );
  assert.deepEqual([...KNOWN_CODES].sort(), Object.keys(CODES).sort(), "the package knows exactly these codes");
});

test("a known code whose fields are missing, null or mistyped is the plain PalisadeError", () => {
  for (const body of [
    `{"error":{"code":"stale_token","message":"m","epoch":1}}`,
    `{"error":{"code":"stale_token","message":"m","high_water":"2","epoch":1}}`,
    `{"error":{"code":"stale_token","message":"m","high_water":null,"epoch":1}}`,
    `{"error":{"code":"stale_token","message":"m","high_water":2.5,"epoch":1}}`,
    `{"error":{"code":"stale_token","message":"m","high_water":-2,"epoch":1}}`,
    `{"error":{"code":"stale_token","message":"m","high_water":18446744073709551616,"epoch":1}}`,
    `{"error":{"code":"lock_held","message":"m","holder":7,"retry_after_ms":0}}`,
    `{"error":{"code":"quota_exceeded","message":"m","limit":1000}}`,
  ]) {
    const decoded = parseError(409, body);
    assert.equal(decoded.constructor, PalisadeError, body);
    assert.equal((decoded as PalisadeError).code, (JSON.parse(body) as { error: { code: string } }).error.code);
  }
});

test("64-bit fields are read exactly, and fields this version does not know are kept in detail", () => {
  const decoded = parseError(
    409,
    `{"error":{"code":"stale_token","message":"m","high_water":18446744073709551615,"epoch":9007199254740993,"later":true}}`,
  );
  assert.ok(decoded instanceof StaleTokenError && isFenced(decoded));
  assert.equal(decoded.highWater, 18446744073709551615n);
  assert.equal(decoded.epoch, 9007199254740993n);
  assert.equal(decoded.detail.later, true);
  assert.ok(isFenced(parseError(409, `{"error":{"code":"stale_sequence","message":"","high_water":1,"high_water_seq":2,"epoch":1,"seq":2}}`)));
  assert.ok(!isFenced(parseError(409, `{"error":{"code":"lock_held","message":"","holder":"a","retry_after_ms":5}}`)));
});

test("an unknown code is the plain PalisadeError with its code and status", () => {
  const decoded = parseError(418, `{"error":{"code":"teapot","message":"short and stout","spout":1}}`);
  assert.equal(decoded.constructor, PalisadeError);
  assert.deepEqual([(decoded as PalisadeError).code, decoded.status, decoded.message], ["teapot", 418, "short and stout"]);
});

test("a body that is not an error envelope is a DecodeError", () => {
  for (const body of ["", "<html>bad gateway</html>", "{}", `{"error":"x"}`, `{"error":{"message":"no code"}}`, `{"error":{"code":7}}`, "[1]"]) {
    const decoded = parseError(502, body);
    assert.ok(decoded instanceof DecodeError, JSON.stringify(body));
    assert.equal(decoded.status, 502);
  }
  assert.equal((parseError(502, "x".repeat(500)) as DecodeError).snippet.length, 200);
});

test("a field under a __proto__ name, or inherited from Object.prototype, is never read as the answer's", () => {
  const fields = `"code":"stale_token","message":"m","high_water":2,"epoch":1`;
  for (const body of [`{"__proto__":{"error":{${fields}}}}`, `{"error":{"__proto__":{${fields}}}}`]) {
    assert.ok(parseError(409, body) instanceof DecodeError, body);
  }
  const hidden = parseError(409, `{"error":{"code":"stale_token","message":"m","__proto__":{"high_water":2,"epoch":1}}}`);
  assert.equal(hidden.constructor, PalisadeError);
  for (const code of ["constructor", "toString", "__proto__", "hasOwnProperty"]) {
    const decoded = parseError(400, `{"error":{"code":${JSON.stringify(code)},"message":"m"}}`);
    assert.equal(decoded.constructor, PalisadeError, code);
    assert.equal((decoded as PalisadeError).code, code);
  }
  assert.ok(parseError(400, `{"error":{"message":"no code","constructor":"x"}}`) instanceof DecodeError);
});

test("errorOf builds the error the server's answer decodes to, fields, detail and cause included", () => {
  const built = errorOf(409, "stale_token", "m", { high_water: 18446744073709551615n, epoch: 1 });
  const answered = parseError(409, `{"error":{"code":"stale_token","message":"m","high_water":18446744073709551615,"epoch":1}}`);
  assert.ok(built instanceof StaleTokenError && answered instanceof StaleTokenError);
  assert.deepEqual(
    [built.status, built.code, built.message, built.highWater, built.epoch, built.detail],
    [answered.status, answered.code, answered.message, answered.highWater, answered.epoch, answered.detail],
  );
  assert.equal(built.cause, undefined);
  const wrong = errorOf(403, "wrong_lock", 'quoted "lock"\n', { token_lock: "invoices" });
  assert.ok(wrong instanceof WrongLockError && wrong.tokenLock === "invoices" && wrong.message === 'quoted "lock"\n');
  const cause = new Error("the database's own");
  const conflict = errorOf(409, "write_conflict", "retry", {}, { cause });
  assert.ok(conflict instanceof WriteConflictError && conflict.code === "write_conflict");
  assert.equal(conflict.cause, cause);
  assert.ok(!Object.keys(conflict).includes("cause"), "cause is not enumerable, as Error's own");
  // A field missing is no typed error, as for the server's answer.
  assert.equal(errorOf(409, "stale_token", "m", { epoch: 1n }).constructor, PalisadeError);
  assert.throws(() => errorOf(409, "stale_token", "m", { high_water: 1.5, epoch: 1 }), TypeError);
  assert.throws(() => errorOf(409, "stale_token", "m", { code: "x" }), TypeError);
});

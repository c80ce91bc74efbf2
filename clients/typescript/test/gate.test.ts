// Tests of the rule every gate shares (src/gate.ts), without a database: the token check
// (trimmed as Rust's str::trim, not as String.prototype.trim), decide at the edges of the
// SQL integer range, fromSql, and each refusal as the client's typed error with the
// server's code, status and fields.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  InvalidTokenError,
  MissingTokenError,
  PalisadeError,
  StaleSequenceError,
  StaleTokenError,
  StorageFailedError,
  WriteConflictError,
  WrongLockError,
  parseError,
} from "../src/errors.js";
import { type HighWater, NO_HIGH_WATER, SQL_INT_MAX, WHITE_SPACE, decide, fromSql, storageFailed, trimWhiteSpace, verifyForLock, writeConflict } from "../src/gate.js";
import { BadSignatureError, type KeyRing, MalformedTokenError, UnknownKeyError, Verifier } from "../src/token.js";
import { newIssuer } from "./issuer.js";

function issuer(): { ring: KeyRing; keyId: string; token: (lock: string, epoch: bigint) => string } {
  const i = newIssuer();
  return { ring: i.ring(), keyId: i.keyId, token: (lock, epoch) => i.token(lock, epoch) };
}

function thrown(f: () => unknown): unknown {
  try {
    f();
  } catch (err) {
    return err;
  }
  assert.fail("did not throw");
}

const mark = (epoch: bigint, seq = 0n): HighWater => ({ epoch, seq });

// The characters with the White_Space property (Unicode's PropList.txt), which Rust's
// str::trim removes: nothing else is.
const UNICODE_WHITE_SPACE = [
  0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007,
  0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000,
];

test("the token is trimmed exactly as Rust's str::trim, which is not String.prototype.trim", () => {
  assert.deepEqual([...WHITE_SPACE].map((c) => c.codePointAt(0)), UNICODE_WHITE_SPACE);
  for (let c = 0; c <= 0xffff; c++) {
    const ch = String.fromCharCode(c);
    assert.equal(trimWhiteSpace(`${ch}x${ch}`) === "x", UNICODE_WHITE_SPACE.includes(c), `U+${c.toString(16)}`);
  }
  // Where JavaScript's trim differs: U+FEFF is no White_Space, U+0085 is.
  assert.equal("\ufeff".trim(), "");
  assert.equal(trimWhiteSpace("\ufeff"), "\ufeff");
  assert.equal("\u0085".trim(), "\u0085");
  assert.equal(trimWhiteSpace("\u0085"), "");

  const { ring, token } = issuer();
  const verifier = new Verifier(ring);
  const genuine = token("orders", 3n);
  assert.equal(verifyForLock(verifier, ` \u0085\u3000${genuine}\u2029\t`, "orders").epoch, 3n);
  for (const missing of [null, undefined, "", "  ", "\u00a0\t", "\u0085", "\u2028\u205f"]) {
    const err = thrown(() => verifyForLock(verifier, missing, "orders"));
    assert.ok(err instanceof MissingTokenError, String(missing));
    assert.deepEqual([err.code, err.status], ["missing_token", 400]);
  }
  // A byte-order mark is not trimmed: the token is then not a token, as in the Rust gate.
  for (const padded of ["\ufeff", `\ufeff${genuine}`]) {
    const err = thrown(() => verifyForLock(verifier, padded, "orders"));
    assert.ok(err instanceof InvalidTokenError && err.cause instanceof MalformedTokenError, JSON.stringify(padded));
  }
});

test("refusals of the token are invalid_token with the verifier's refusal as cause, or wrong_lock", () => {
  const { ring, keyId, token } = issuer();
  const verifier = new Verifier(ring);
  const genuine = token("orders", 7n);
  const at = genuine.length - 10;
  const forged = genuine.slice(0, at) + (genuine[at] === "A" ? "B" : "A") + genuine.slice(at + 1);
  for (const [tok, cause] of [
    ["2", MalformedTokenError],
    ["pal1.garbage.signature", MalformedTokenError],
    [forged, BadSignatureError],
    [issuer().token("orders", 1n), UnknownKeyError],
  ] as const) {
    const err = thrown(() => verifyForLock(verifier, tok, "orders"));
    assert.ok(err instanceof InvalidTokenError, tok);
    assert.ok(err.cause instanceof cause, `${tok}: ${String(err.cause)}`);
    assert.deepEqual([err.code, err.status, err.message], ["invalid_token", 400, (err.cause as Error).message]);
  }
  const nonText = thrown(() => verifyForLock(verifier, 2 as unknown as string, "orders"));
  assert.ok(nonText instanceof InvalidTokenError && nonText.cause instanceof MalformedTokenError);
  const wrong = thrown(() => verifyForLock(verifier, token("invoices", 9n), "orders"));
  assert.ok(wrong instanceof WrongLockError);
  assert.deepEqual([wrong.code, wrong.status, wrong.tokenLock], ["wrong_lock", 403, "invoices"]);
  assert.equal(wrong.message, 'token is for lock "invoices", not "orders"');
  assert.deepEqual(verifyForLock(verifier, genuine, "orders"), { lock: "orders", epoch: 7n, holder: "w", keyId });
});

test("decide: older epochs are stale, equal or larger ones raise the mark (S8)", () => {
  assert.deepEqual(decide(NO_HIGH_WATER, "epoch", 1n), mark(1n));
  assert.deepEqual(decide(mark(2n, 9n), "epoch", 2n, 5n), mark(2n), "the epoch policy stores seq 0");
  assert.deepEqual(decide(mark(2n), "epoch", 3n), mark(3n));
  const stale = thrown(() => decide(mark(5n), "epoch", 4n));
  assert.ok(stale instanceof StaleTokenError);
  assert.deepEqual([stale.code, stale.status, stale.highWater, stale.epoch], ["stale_token", 409, 5n, 4n]);
  assert.equal(stale.message, "epoch 4 is older than the high-water mark 5");
  // Exactly as the server's own answer would decode.
  const answer = parseError(409, `{"error":{"code":"stale_token","message":"epoch 4 is older than the high-water mark 5","high_water":5,"epoch":4}}`);
  assert.deepEqual(stale.detail, (answer as PalisadeError).detail);
  assert.equal(stale.constructor, answer.constructor);
});

test("decide: under the sequence policy (epoch, seq) must strictly increase", () => {
  assert.deepEqual(decide(mark(1n, 1n), "sequence", 1n, 2n), mark(1n, 2n));
  assert.deepEqual(decide(mark(1n, 5n), "sequence", 2n, 0n), mark(2n, 0n), "a new epoch restarts its sequence");
  for (const seq of [5n, 4n, 0n]) {
    const replay = thrown(() => decide(mark(1n, 5n), "sequence", 1n, seq));
    assert.ok(replay instanceof StaleSequenceError);
    assert.deepEqual(
      [replay.code, replay.status, replay.highWater, replay.highWaterSeq, replay.epoch, replay.seq],
      ["stale_sequence", 409, 1n, 5n, 1n, seq],
    );
  }
  assert.ok(thrown(() => decide(mark(3n, 1n), "sequence", 2n, 99n)) instanceof StaleTokenError);
  assert.ok(thrown(() => decide(NO_HIGH_WATER, "sequence", 1n, -1n)) instanceof RangeError);
  assert.ok(thrown(() => decide(NO_HIGH_WATER, "sequence", 1n, 1n << 64n)) instanceof RangeError);
  assert.ok(thrown(() => decide(NO_HIGH_WATER, "sequence", 1n, 1 as unknown as bigint)) instanceof RangeError);
  assert.ok(thrown(() => decide(NO_HIGH_WATER, "epoch", -1n)) instanceof RangeError);
});

test("decide: a mark past 2^63-1 is storage_failed, never wrapped", () => {
  assert.equal(SQL_INT_MAX, 9223372036854775807n);
  assert.deepEqual(decide(NO_HIGH_WATER, "epoch", SQL_INT_MAX), mark(SQL_INT_MAX));
  assert.deepEqual(decide(NO_HIGH_WATER, "sequence", SQL_INT_MAX, SQL_INT_MAX), mark(SQL_INT_MAX, SQL_INT_MAX));
  for (const [epoch, seq, policy] of [
    [SQL_INT_MAX + 1n, 0n, "epoch"],
    [(1n << 64n) - 1n, 0n, "epoch"],
    [1n, SQL_INT_MAX + 1n, "sequence"],
  ] as const) {
    const err = thrown(() => decide(NO_HIGH_WATER, policy, epoch, seq));
    assert.ok(err instanceof StorageFailedError, `${epoch}, ${seq}`);
    assert.deepEqual([err.code, err.status], ["storage_failed", 503]);
    assert.match(err.message, /exceeds the SQL integer range/);
  }
});

test("fromSql reads two integers from 0 to 2^63-1 exactly, and refuses anything else", () => {
  assert.deepEqual(fromSql("9223372036854775807", "0"), mark(SQL_INT_MAX));
  assert.deepEqual(fromSql(3n, 4n), mark(3n, 4n));
  for (const [epoch, seq] of [
    ["-1", "0"],
    ["0", "-5"],
    [-1n, 0n],
    ["9223372036854775808", "0"],
    ["1.5", "0"],
    ["", "0"],
    ["01", "0"],
    [" 1", "0"],
    [1 as unknown as bigint, 0n],
  ] as const) {
    const err = thrown(() => fromSql(epoch, seq));
    assert.ok(err instanceof StorageFailedError, `${String(epoch)}, ${String(seq)}`);
    assert.match(err.message, /^unreadable fence record: mark /);
  }
});

test("write_conflict and storage_failed carry their cause", () => {
  const db = new Error("could not serialize access");
  const conflict = writeConflict(db);
  assert.ok(conflict instanceof WriteConflictError);
  assert.deepEqual([conflict.code, conflict.status, conflict.cause], ["write_conflict", 409, db]);
  const failed = storageFailed("PostgreSQL failed: x", db);
  assert.ok(failed instanceof StorageFailedError);
  assert.deepEqual([failed.code, failed.status, failed.cause], ["storage_failed", 503, db]);
  assert.equal(storageFailed("no cause").cause, undefined);
});

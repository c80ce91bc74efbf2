// What every gate shares (src/gates/postgres.ts is one): the token check before anything
// is touched, the gate rule that decides the new high-water mark, and the refusals, the
// same as the Rust palisade-adapters crate and the Python, Go and Java gates
// (docs/protecting-your-database.md).
//
// A gate admits an operation in two steps:
//
//  1. verifyForLock: the token is present, genuine (verified offline, keys from
//     GET /v1/keys) and names the lock guarding the data; a refusal here has touched
//     nothing (S12);
//  2. inside the caller's transaction, the backend reads the lock's mark, applies decide,
//     and stores the new mark, so that the mark and the caller's writes commit together
//     or not at all (S6).
//
// Refusals are the client's typed errors (src/errors.ts, built by errorOf as the server's
// answers decode), with the server's codes and fields: MissingTokenError,
// InvalidTokenError (its `cause` the verifier's TokenError), WrongLockError (`tokenLock`),
// StaleTokenError (`highWater`, `epoch`), StaleSequenceError, WriteConflictError (a lost
// race: retry the whole transaction) and StorageFailedError (the database failed, or its
// fence table holds what no gate wrote).
//
// What a gate does not guarantee: it does not deduplicate retries (S9; use the sequence
// policy), it does not cancel in-flight work (S10), it protects only the writes that go
// through it (S2), it is as durable as the database (S11), and it is not access control
// (S14).

import { type PalisadeError, errorOf } from "./errors.js";
import { type Claims, MalformedTokenError, TokenError, type Verifier, WrongLockTokenError } from "./token.js";

/** How a lock's mark orders the operations it admits: "epoch" admits equal or larger
 * epochs and refuses smaller ones (S8); "sequence" also needs (epoch, seq) to strictly
 * increase with every operation. */
export type Policy = "epoch" | "sequence";

/** The largest (epoch, seq) a resource has admitted for one lock; (0, 0) when none. */
export interface HighWater {
  readonly epoch: bigint;
  readonly seq: bigint;
}

/** The mark of a lock never admitted. */
export const NO_HIGH_WATER: HighWater = Object.freeze({ epoch: 0n, seq: 0n });

/** What an admitted operation may rely on, returned only once the new mark was written
 * inside the caller's transaction. */
export interface Admitted {
  /** The verified claims of the token. */
  readonly claims: Claims;
  /** The mark before this operation. */
  readonly previous: HighWater;
  /** The mark this operation commits together with the caller's writes. */
  readonly highWater: HighWater;
}

/** SQL integers are signed 64-bit: a mark past this is refused, never wrapped. */
export const SQL_INT_MAX = (1n << 63n) - 1n;
const U64_MAX = (1n << 64n) - 1n;

/** The characters with Unicode's White_Space property, which Rust's `str::trim` removes.
 * JavaScript's `String.prototype.trim` differs: it also removes U+FEFF (not White_Space)
 * and keeps U+0085 (which is): a token padded with either would pass here and fail in the
 * Rust gate, or the other way round. */
export const WHITE_SPACE =
  "\t\n\u000b\f\r\u0020\u0085\u00a0\u1680" +
  "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" +
  "\u2028\u2029\u202f\u205f\u3000";

/** `text` without leading and trailing White_Space, exactly as Rust's `str::trim`. */
export function trimWhiteSpace(text: string): string {
  let start = 0;
  let end = text.length;
  while (start < end && WHITE_SPACE.includes(text[start]!)) start++;
  while (end > start && WHITE_SPACE.includes(text[end - 1]!)) end--;
  return text.slice(start, end);
}

/** Checks that `token` is present, genuine and names `lock`, and returns its claims. It
 * touches no resource, so a refusal here has written nothing. A token that is null,
 * undefined, or empty once White_Space is trimmed (as Rust's `str::trim` does) is
 * missing_token; anything else that is not a genuine token is invalid_token, whose
 * `cause` is the verifier's refusal; a genuine token for another lock is wrong_lock. */
export function verifyForLock(verifier: Verifier, token: string | null | undefined, lock: string): Claims {
  if (token === null || token === undefined) throw missingToken();
  if (typeof token !== "string") {
    // Only from JavaScript callers: the type says string.
    throw invalidToken(new MalformedTokenError(`malformed token: a ${typeof token}, not text`));
  }
  const trimmed = trimWhiteSpace(token);
  if (trimmed === "") throw missingToken();
  try {
    return verifier.verify(trimmed, lock);
  } catch (err) {
    if (err instanceof WrongLockTokenError) {
      throw errorOf(403, "wrong_lock", `token is for lock ${JSON.stringify(err.tokenLock)}, not ${JSON.stringify(lock)}`, {
        token_lock: err.tokenLock,
      });
    }
    if (err instanceof TokenError) throw invalidToken(err);
    throw err;
  }
}

function missingToken(): PalisadeError {
  return errorOf(400, "missing_token", "this operation needs a fencing token");
}

function invalidToken(refusal: TokenError): PalisadeError {
  return errorOf(400, "invalid_token", refusal.message, {}, { cause: refusal });
}

/** The gate rule of palisade-core: the new mark to store, or the refusal. It refuses
 * `epoch < current.epoch` (StaleTokenError); under the epoch policy it admits and raises
 * the mark to (epoch, 0); under the sequence policy (epoch, seq) must also strictly exceed
 * the mark (StaleSequenceError). A mark past the SQL integer range (2^63 − 1) is refused
 * as storage_failed rather than wrapped. `epoch` and `seq` are from 0 to 2^64 − 1 (a
 * RangeError otherwise); `seq` is ignored under the epoch policy. Correct only when the
 * caller reads `current` and stores the result in one transaction with the write. */
export function decide(current: HighWater, policy: Policy, epoch: bigint, seq: bigint = 0n): HighWater {
  if (policy !== "epoch" && policy !== "sequence") throw new TypeError(`unknown policy ${String(policy)}`);
  if (!isU64(epoch)) throw new RangeError(`the epoch is not a bigint from 0 to 2^64-1: ${String(epoch)}`);
  if (policy === "sequence" && !isU64(seq)) {
    throw new RangeError(`the sequence policy needs a sequence number (a bigint) from 0 to 2^64-1, not ${String(seq)}`);
  }
  if (epoch < current.epoch) {
    throw errorOf(409, "stale_token", `epoch ${epoch} is older than the high-water mark ${current.epoch}`, {
      high_water: current.epoch,
      epoch,
    });
  }
  let next: HighWater = { epoch, seq: 0n };
  if (policy === "sequence") {
    if (epoch === current.epoch && seq <= current.seq) {
      throw errorOf(409, "stale_sequence", `sequence ${seq} is not above ${current.seq} within epoch ${epoch}`, {
        high_water: current.epoch,
        high_water_seq: current.seq,
        epoch,
        seq,
      });
    }
    next = { epoch, seq };
  }
  if (next.epoch > SQL_INT_MAX || next.seq > SQL_INT_MAX) {
    throw storageFailed(`mark (${next.epoch}, ${next.seq}) exceeds the SQL integer range`);
  }
  return Object.freeze(next);
}

/** A stored mark read back: two integers from 0 to 2^63 − 1, as bigints or as the decimal
 * text PostgreSQL sends for a bigint column. Anything else means the fence table was
 * edited by hand, and the gate refuses to guess (storage_failed). */
export function fromSql(epoch: bigint | string, seq: bigint | string): HighWater {
  const e = sqlInt(epoch);
  const s = sqlInt(seq);
  if (e === undefined || s === undefined || e < 0n || s < 0n) {
    throw storageFailed(`unreadable fence record: mark (${String(epoch)}, ${String(seq)})`);
  }
  return Object.freeze({ epoch: e, seq: s });
}

function sqlInt(value: unknown): bigint | undefined {
  if (typeof value === "bigint") return value >= -SQL_INT_MAX - 1n && value <= SQL_INT_MAX ? value : undefined;
  if (typeof value === "string" && /^-?(?:0|[1-9][0-9]*)$/.test(value)) return sqlInt(BigInt(value));
  return undefined;
}

function isU64(value: unknown): value is bigint {
  return typeof value === "bigint" && value >= 0n && value <= U64_MAX;
}

/** write_conflict: a lost race (with the database's own error as `cause`); nothing of
 * the operation committed, retry the whole transaction. */
export function writeConflict(cause: unknown): PalisadeError {
  return errorOf(409, "write_conflict", "concurrent update of the fenced resource; retry", {}, { cause });
}

/** storage_failed, with its cause when there is one. */
export function storageFailed(message: string, cause?: unknown): PalisadeError {
  return errorOf(503, "storage_failed", message, {}, cause === undefined ? undefined : { cause });
}

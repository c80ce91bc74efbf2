// The server's error answers as typed errors: `parseError(status, body)` turns
// {"error":{"code","message",...fields}} into the subclass of PalisadeError for its code
// (docs/api.md, "Error codes"; the codes and fields of palisade_api::ErrorDetail, which
// vectors/errors.json samples), carrying its fields typed. Counters (epochs, sequence
// numbers, revisions, limits) are bigints, read exactly; milliseconds are numbers.
// `errorOf(status, code, message, fields)` builds the same typed error for a refusal made
// in this process (the gates, src/gate.ts), through the same decoding.

import { type Json, type JsonObject, parseJson, safeInteger, u64 } from "./json.js";

/** What every error answer has. */
export interface ErrorAnswer {
  /** The HTTP status. */
  status: number;
  /** The stable code, like "stale_token". */
  code: string;
  /** The text for humans. */
  message: string;
  /** The whole `error` object as the server sent it (JSON.parse's reading), for fields
   * this version does not know. */
  detail: Record<string, unknown>;
}

/** An error answer of the server. Every code this version knows has its subclass below;
 * a code it does not know, or a known code whose fields are missing or of another type,
 * is a plain PalisadeError (no field is ever invented). `message` is the server's. */
export class PalisadeError extends Error {
  readonly status: number;
  readonly code: string;
  readonly detail: Record<string, unknown>;

  constructor(answer: ErrorAnswer) {
    super(answer.message);
    this.name = new.target.name;
    this.status = answer.status;
    this.code = answer.code;
    this.detail = answer.detail;
  }
}

/** 400 bad_request: the request was refused as malformed. */
export class BadRequestError extends PalisadeError {}
/** 400 missing_token: a fenced mutation without a Fencing-Token header. */
export class MissingTokenError extends PalisadeError {}
/** 400 invalid_token: the token is not genuine (malformed, unknown key, bad signature). */
export class InvalidTokenError extends PalisadeError {}
/** 401 unauthenticated: no credentials, or unknown ones. */
export class UnauthenticatedError extends PalisadeError {}
/** 404 lease_expired: the lease is gone (expired or released). */
export class LeaseExpiredError extends PalisadeError {}
/** 404 session_expired: the session named is gone. */
export class SessionExpiredError extends PalisadeError {}
/** 405 method_not_allowed. */
export class MethodNotAllowedError extends PalisadeError {}
/** 414 uri_too_long. */
export class UriTooLongError extends PalisadeError {}
/** 422 idempotency_conflict: an Idempotency-Key reused for another request. */
export class IdempotencyConflictError extends PalisadeError {}
/** 431 headers_too_large. */
export class HeadersTooLargeError extends PalisadeError {}
/** 409 write_conflict: a gate lost a race inside the caller's database (a serialisation
 * failure, a deadlock, a lock not available); nothing of the operation committed: retry
 * the whole transaction. Raised by the gates in this process; no server answer carries
 * it. */
export class WriteConflictError extends PalisadeError {}
/** 503 storage_failed: the store has latched a storage failure (from a gate: the database
 * failed, or its fence table holds what no gate wrote). */
export class StorageFailedError extends PalisadeError {}
/** 503 unavailable: the server is shutting down, or cannot answer now. */
export class UnavailableError extends PalisadeError {}

/** 409 stale_token: a newer epoch (`highWater`) reached the resource first; this holder
 * (`epoch`) is fenced off. */
export class StaleTokenError extends PalisadeError {
  constructor(
    answer: ErrorAnswer,
    readonly highWater: bigint,
    readonly epoch: bigint,
  ) {
    super(answer);
  }
}

/** 409 stale_sequence: within the epoch, a sequence number at or below the last one
 * admitted. */
export class StaleSequenceError extends PalisadeError {
  constructor(
    answer: ErrorAnswer,
    readonly highWater: bigint,
    readonly highWaterSeq: bigint,
    readonly epoch: bigint,
    readonly seq: bigint,
  ) {
    super(answer);
  }
}

/** 409 lock_held. `holder` is null while the lock sits in its lock-delay, or when the
 * caller may not see holders. */
export class LockHeldError extends PalisadeError {
  constructor(
    answer: ErrorAnswer,
    readonly holder: string | null,
    readonly retryAfterMs: number,
  ) {
    super(answer);
  }
}

/** 409 key_active: the key `keyId` still signs and cannot be retired. */
export class KeyActiveError extends PalisadeError {
  constructor(
    answer: ErrorAnswer,
    readonly keyId: string,
  ) {
    super(answer);
  }
}

/** 412 revision_mismatch: an If-Match or If-None-Match precondition failed;
 * `currentRevision` is null when the key does not exist. */
export class RevisionMismatchError extends PalisadeError {
  constructor(
    answer: ErrorAnswer,
    readonly currentRevision: bigint | null,
  ) {
    super(answer);
  }
}

/** 403 wrong_lock: the token is genuine but for lock `tokenLock`. */
export class WrongLockError extends PalisadeError {
  constructor(
    answer: ErrorAnswer,
    readonly tokenLock: string,
  ) {
    super(answer);
  }
}

/** What a quota limits (palisade_api's QuotaResource); a later server may name others. */
export type QuotaResource =
  | "locks"
  | "leases_per_principal"
  | "waiters_per_lock"
  | "waiters_per_principal"
  | "sessions"
  | "keys_per_namespace"
  | "bytes_per_namespace"
  | "verifying_keys"
  | "concurrent_backups"
  | "lock_delay_ms"
  | "ttl_ms"
  | "event_subscribers"
  | "event_subscribers_per_principal"
  | (string & {});

/** 429 quota_exceeded: `resource` is limited to `limit`; nothing changed. */
export class QuotaExceededError extends PalisadeError {
  constructor(
    answer: ErrorAnswer,
    readonly resource: QuotaResource,
    readonly limit: bigint,
  ) {
    super(answer);
  }
}

/** 413 payload_too_large; `limit` is null when the connection's own limit refused the
 * request. */
export class PayloadTooLargeError extends PalisadeError {
  constructor(
    answer: ErrorAnswer,
    readonly limit: bigint | null,
  ) {
    super(answer);
  }
}

/** 403 permission_denied; `principal` is the principal refused, when the caller named one. */
export class PermissionDeniedError extends PalisadeError {
  constructor(
    answer: ErrorAnswer,
    readonly principal: string | null,
  ) {
    super(answer);
  }
}

/** 404 not_found; `keyId` is the key an admin key route did not find. */
export class NotFoundError extends PalisadeError {
  constructor(
    answer: ErrorAnswer,
    readonly keyId: string | null,
  ) {
    super(answer);
  }
}

/** An answer this client cannot read as an error body (a proxy's HTML page, an empty 404
 * from a wrong base URL), or a success whose body is not what the route answers: never a
 * guessed code. */
export class DecodeError extends Error {
  constructor(
    readonly status: number,
    readonly snippet: string,
  ) {
    super(`HTTP ${status} with a body that is not a Palisade answer: ${JSON.stringify(snippet)}`);
    this.name = "DecodeError";
  }
}

/** Whether `err` says this holder's epoch is fenced off (stale_token or stale_sequence). */
export function isFenced(err: unknown): err is StaleTokenError | StaleSequenceError {
  return err instanceof StaleTokenError || err instanceof StaleSequenceError;
}

/** Reads fields strictly: a field missing, null where a value is required, or of another
 * type marks the reading failed. */
class Fields {
  ok = true;
  constructor(readonly json: JsonObject) {}

  #got<T>(name: string, read: (value: Json | undefined) => T | undefined, fallback: T): T {
    const value = read(this.json.get(name));
    if (value === undefined) {
      this.ok = false;
      return fallback;
    }
    return value;
  }

  u64(name: string): bigint {
    return this.#got(name, u64, 0n);
  }
  ms(name: string): number {
    return this.#got(name, safeInteger, 0);
  }
  str(name: string): string {
    return this.#got(name, (v) => (typeof v === "string" ? v : undefined), "");
  }
  /** null when absent or null. */
  optU64(name: string): bigint | null {
    const value = this.json.get(name);
    return value === undefined || value === null ? null : this.u64(name);
  }
  /** null when absent or null. */
  optStr(name: string): string | null {
    const value = this.json.get(name);
    return value === undefined || value === null ? null : this.str(name);
  }
}

type Decoder = (answer: ErrorAnswer, f: Fields) => PalisadeError;

const DECODERS: Record<string, Decoder> = {
  bad_request: (a) => new BadRequestError(a),
  missing_token: (a) => new MissingTokenError(a),
  invalid_token: (a) => new InvalidTokenError(a),
  unauthenticated: (a) => new UnauthenticatedError(a),
  wrong_lock: (a, f) => new WrongLockError(a, f.str("token_lock")),
  permission_denied: (a, f) => new PermissionDeniedError(a, f.optStr("principal")),
  not_found: (a, f) => new NotFoundError(a, f.optStr("key_id")),
  lease_expired: (a) => new LeaseExpiredError(a),
  session_expired: (a) => new SessionExpiredError(a),
  method_not_allowed: (a) => new MethodNotAllowedError(a),
  stale_token: (a, f) => new StaleTokenError(a, f.u64("high_water"), f.u64("epoch")),
  stale_sequence: (a, f) =>
    new StaleSequenceError(a, f.u64("high_water"), f.u64("high_water_seq"), f.u64("epoch"), f.u64("seq")),
  lock_held: (a, f) => new LockHeldError(a, f.optStr("holder"), f.ms("retry_after_ms")),
  key_active: (a, f) => new KeyActiveError(a, f.str("key_id")),
  revision_mismatch: (a, f) => new RevisionMismatchError(a, f.optU64("current_revision")),
  payload_too_large: (a, f) => new PayloadTooLargeError(a, f.optU64("limit")),
  uri_too_long: (a) => new UriTooLongError(a),
  idempotency_conflict: (a) => new IdempotencyConflictError(a),
  headers_too_large: (a) => new HeadersTooLargeError(a),
  quota_exceeded: (a, f) => new QuotaExceededError(a, f.str("resource"), f.u64("limit")),
  write_conflict: (a) => new WriteConflictError(a),
  storage_failed: (a) => new StorageFailedError(a),
  unavailable: (a) => new UnavailableError(a),
};

/** The codes this version decodes into their own subclass. */
export const KNOWN_CODES: readonly string[] = Object.freeze(Object.keys(DECODERS));

/** Turns a non-success answer into its typed error: a PalisadeError (its subclass for a
 * known code) or, when the body is not an error envelope, a DecodeError. */
export function parseError(status: number, body: string | Uint8Array): PalisadeError | DecodeError {
  const text = typeof body === "string" ? body : new TextDecoder().decode(body);
  let envelope: Json;
  let detail: unknown;
  try {
    envelope = parseJson(text);
    detail = (JSON.parse(text) as { error?: unknown }).error;
  } catch {
    return new DecodeError(status, text.slice(0, 200));
  }
  const error = envelope instanceof Map ? envelope.get("error") : undefined;
  const code = error instanceof Map ? error.get("code") : undefined;
  if (!(error instanceof Map) || typeof code !== "string") {
    return new DecodeError(status, text.slice(0, 200));
  }
  const message = error.get("message");
  const answer: ErrorAnswer = {
    status,
    code,
    message: typeof message === "string" ? message : "",
    detail: detail as Record<string, unknown>,
  };
  const decode = Object.hasOwn(DECODERS, code) ? DECODERS[code] : undefined;
  if (decode === undefined) return new PalisadeError(answer);
  const fields = new Fields(error);
  const typed = decode(answer, fields);
  return fields.ok ? typed : new PalisadeError(answer);
}

/** A field of {@link errorOf}: text, a whole number (a bigint, or a number that is a safe
 * integer), or null. */
export type ErrorField = string | bigint | number | null;

/** The typed error for `code` with `fields` (by their wire names, like `high_water`), as
 * if the server had answered `status` with them: the error object is written as the
 * server writes it and decoded by {@link parseError}, so that a refusal decided in this
 * process (by a gate) is the same class, with the same fields and `detail`, as the
 * server's answer. `options.cause` becomes the error's `cause`. */
export function errorOf(
  status: number,
  code: string,
  message: string,
  fields: Readonly<Record<string, ErrorField>> = {},
  options?: ErrorOptions,
): PalisadeError {
  let body = `{"error":{"code":${JSON.stringify(code)},"message":${JSON.stringify(message)}`;
  for (const [name, value] of Object.entries(fields)) {
    if (name === "code" || name === "message") throw new TypeError(`errorOf: ${name} is not a field`);
    body += `,${JSON.stringify(name)}:${fieldJson(name, value)}`;
  }
  const error = parseError(status, `${body}}}`);
  if (!(error instanceof PalisadeError)) throw new TypeError(`errorOf: not an error answer: ${error.message}`);
  if (options !== undefined && "cause" in options) {
    // As Error's constructor sets it: an own property, not enumerable.
    Object.defineProperty(error, "cause", { value: options.cause, writable: true, configurable: true, enumerable: false });
  }
  return error;
}

function fieldJson(name: string, value: ErrorField): string {
  if (value === null) return "null";
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "bigint") return value.toString();
  if (typeof value === "number" && Number.isSafeInteger(value)) return String(value);
  throw new TypeError(`errorOf: field ${name} is not text, a whole number or null`);
}

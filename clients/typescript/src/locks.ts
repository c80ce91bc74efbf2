// Locks and leases on the wire (docs/api.md, "Locks and leases", "Recipes"): the
// acquisition with its options (a value, a lock-delay, a session), keepalive, release,
// proclaim (replace a lease's value), a lock's status and the paged listing of locks.
// Client's methods of the same names call these.

import { type Answer, type Caller, CALL, base64, nullableMs, nullableStr, nullableU64, orNull, query, segment, str, toBase64, wholeMs } from "./http.js";
import { type JsonObject, safeInteger, u64 } from "./json.js";
import type { CallOptions } from "./kv.js";

/** The settings of one acquisition. */
export interface AcquireOptions extends CallOptions {
  /** Who holds the lease (with authentication: a label after the principal's name).
   * Required by a server without authentication. */
  holder?: string;
  /** How long the lease lives without a keepalive, in whole milliseconds (50 to
   * 3,600,000 by default). Required unless `session` is given, which sets the TTL. */
  ttlMs?: number;
  /** How long to wait in the lock's first-come first-served line, in milliseconds; 0 (the
   * default) refuses at once with LockHeldError when the lock is held. */
  waitMs?: number;
  /** The lock's value while this lease holds it (at most 4,096 bytes), shown in its
   * status to everyone who may see the lock. */
  value?: Uint8Array;
  /** This lease's lock-delay: if it expires, the lock stays ungrantable this long. */
  lockDelayMs?: number;
  /** A session id: the lease takes the session's TTL and ends with it. */
  session?: string;
}

/** A granted lock: its epoch and the signed token every write it guards carries. */
export interface Lease {
  readonly lock: string;
  readonly holder: string;
  readonly epoch: bigint;
  readonly token: string;
  readonly leaseId: string;
  readonly ttlMs: number;
  readonly lockDelayMs: number;
  /** The value given at acquisition, or null. */
  readonly value: Uint8Array | null;
  /** The session the lease belongs to, or null. */
  readonly session: string | null;
}

/** A renewed lease: it runs a full `ttlMs` from the renewal. */
export interface Renewed {
  readonly leaseId: string;
  readonly lock: string;
  readonly epoch: bigint;
  readonly ttlMs: number;
}

/** A lease's new value (POST /v1/leases/{id}/proclaim). */
export interface Proclaimed {
  readonly leaseId: string;
  readonly lock: string;
  readonly epoch: bigint;
  readonly value: Uint8Array | null;
}

/** A lock's status. While it is free, `holder`, `leaseId`, `remainingMs`, `leaseEpoch`,
 * `value` and `lockDelayMs` are null and `epoch` is the last one granted (0 if never). */
export interface LockStatus {
  readonly lock: string;
  readonly epoch: bigint;
  readonly holder: string | null;
  /** Null also for a caller who does not own the lease, with authentication on. */
  readonly leaseId: string | null;
  readonly remainingMs: number | null;
  readonly waiters: number;
  readonly leaseEpoch: bigint | null;
  readonly value: Uint8Array | null;
  readonly lockDelayMs: number | null;
  /** The live lease's session (shown to its owner only), or null. */
  readonly session: string | null;
  /** No epoch above this was granted; null from a server that does not send it. */
  readonly epochBound: bigint | null;
}

/** The options of a page of locks. */
export interface LockPageOptions extends CallOptions {
  /** Only the locks whose names start with it. */
  prefix?: string;
  /** The locks whose names sort after it (a page's `next`). */
  after?: string;
  /** At most this many (the server's default 1,000, at most 10,000). */
  limit?: number;
}

/** One page of locks, in name order; `next` (the `after` of the following page) is null
 * on the last. With authentication on, a page may hold fewer than `limit` before the end. */
export interface LockPage {
  readonly locks: readonly LockStatus[];
  readonly next: string | null;
}

export async function acquire(client: Caller, lock: string, options: AcquireOptions): Promise<Lease> {
  const { holder, ttlMs, waitMs = 0, value, lockDelayMs, session } = options;
  const body: Record<string, unknown> = {};
  if (ttlMs !== undefined) {
    wholeMs("ttlMs", ttlMs);
    body.ttl_ms = ttlMs;
  } else if (session === undefined) {
    throw new TypeError("ttlMs is required unless session is given");
  }
  wholeMs("waitMs", waitMs);
  if (holder !== undefined && holder !== "") body.holder = holder;
  if (waitMs > 0) body.wait_ms = waitMs;
  if (value !== undefined) body.value = toBase64(value);
  if (lockDelayMs !== undefined) {
    wholeMs("lockDelayMs", lockDelayMs);
    body.lock_delay_ms = lockDelayMs;
  }
  if (session !== undefined) body.session = session;
  const answer = await client[CALL]("POST", `/v1/locks/${segment("lock name", lock)}/acquire`, {
    json: body,
    signal: options.signal,
    extraMs: waitMs,
    retry: "unlessUnknown",
  });
  const o = answer.object();
  return answer.read<Lease>({
    lock: str(o.get("lock")),
    holder: str(o.get("holder")),
    epoch: u64(o.get("epoch")),
    token: str(o.get("token")),
    leaseId: str(o.get("lease_id")),
    ttlMs: safeInteger(o.get("ttl_ms")),
    lockDelayMs: safeInteger(o.get("lock_delay_ms")),
    value: orNull(o.get("value"), base64),
    session: nullableStr(o.get("session")),
  });
}

/** The lease id, lock and epoch of an answer about one lease: a renewal, a proclaim, a
 * session's lease. */
export function leaseRef(o: JsonObject): { leaseId: string | undefined; lock: string | undefined; epoch: bigint | undefined } {
  return { leaseId: str(o.get("lease_id")), lock: str(o.get("lock")), epoch: u64(o.get("epoch")) };
}

/** POST /v1/leases/{id}/{action}, with `json` as its body when given: every lease route
 * is safe to resend. */
function leaseCall(client: Caller, leaseId: string, action: string, options: CallOptions, json?: unknown): Promise<Answer> {
  return client[CALL]("POST", `/v1/leases/${segment("lease id", leaseId)}/${action}`, { json, signal: options.signal, retry: "safe" });
}

export async function keepAlive(client: Caller, leaseId: string, options: CallOptions): Promise<Renewed> {
  const answer = await leaseCall(client, leaseId, "keepalive", options);
  const o = answer.object();
  return answer.read<Renewed>({ ...leaseRef(o), ttlMs: safeInteger(o.get("ttl_ms")) });
}

export async function release(client: Caller, leaseId: string, options: CallOptions): Promise<void> {
  await leaseCall(client, leaseId, "release", options);
}

export async function proclaim(client: Caller, leaseId: string, value: Uint8Array | null, options: CallOptions): Promise<Proclaimed> {
  const answer = await leaseCall(client, leaseId, "proclaim", options, { value: value === null ? null : toBase64(value) });
  const o = answer.object();
  return answer.read<Proclaimed>({ ...leaseRef(o), value: orNull(o.get("value"), base64) });
}

function readStatus(o: JsonObject): { [K in keyof LockStatus]: LockStatus[K] | undefined } {
  return {
    lock: str(o.get("lock")),
    epoch: u64(o.get("epoch")),
    holder: nullableStr(o.get("holder")),
    leaseId: nullableStr(o.get("lease_id")),
    remainingMs: nullableMs(o.get("remaining_ms")),
    waiters: safeInteger(o.get("waiters")),
    leaseEpoch: nullableU64(o.get("lease_epoch")),
    value: orNull(o.get("value"), base64),
    lockDelayMs: nullableMs(o.get("lock_delay_ms")),
    session: nullableStr(o.get("session")),
    epochBound: nullableU64(o.get("epoch_bound")),
  };
}

export async function lockStatus(client: Caller, lock: string, options: CallOptions): Promise<LockStatus> {
  const answer = await client[CALL]("GET", `/v1/locks/${segment("lock name", lock)}`, { signal: options.signal });
  return answer.read<LockStatus>(readStatus(answer.object()));
}

export async function lockPage(client: Caller, options: LockPageOptions): Promise<LockPage> {
  if (options.limit !== undefined && (!Number.isSafeInteger(options.limit) || options.limit < 1)) {
    throw new RangeError(`limit must be a whole number above 0, not ${options.limit}`);
  }
  const path = `/v1/locks${query({ prefix: options.prefix, after: options.after, limit: options.limit })}`;
  const answer = await client[CALL]("GET", path, { signal: options.signal });
  const o = answer.object();
  const locks = answer.objects<LockStatus>(o.get("locks"), readStatus);
  return answer.read<LockPage>({ locks: Object.freeze(locks), next: nullableStr(o.get("next")) });
}

// The fenced store (docs/api.md, "The fenced store"): put with its options (If-Match,
// If-None-Match "*", Idempotency-Key, Fencing-Seq), get, delete and the key listing.
// Client's put/get/delete/list call these.

import { DecodeError } from "./errors.js";
import { type Caller, CALL, decimalU64, kvPath, query, segment, str, u64Arg } from "./http.js";
import { u64 } from "./json.js";

/** Settings every call takes. */
export interface CallOptions {
  /** Aborts the request. */
  signal?: AbortSignal;
}

/** The options of a fenced mutation (a put, a delete). */
export interface WriteOptions extends CallOptions {
  /** `Fencing-Seq`: required in namespaces whose policy is `sequence`. */
  seq?: bigint;
  /** `Idempotency-Key` (1 to 128 bytes from `!` to `~`): a retry with the same key
   * returns the first outcome, with `replayed` true, without applying twice. */
  idempotencyKey?: string;
  /** `If-Match: "<revision>"`: the key's current revision must be this one, else
   * RevisionMismatchError. */
  ifMatch?: bigint;
  /** `If-None-Match: *`: the key must not exist, else RevisionMismatchError. */
  ifAbsent?: boolean;
}

/** The answer to a fenced write: the key's new revision and the epoch that wrote it. */
export interface Written {
  readonly revision: bigint;
  readonly epoch: bigint;
  /** Whether the server answered a retry with the first outcome (Idempotent-Replayed). */
  readonly replayed: boolean;
}

/** A key of the fenced store: its value, revision, and the epoch that wrote it. */
export interface Entry {
  readonly value: Uint8Array;
  readonly revision: bigint;
  readonly epoch: bigint;
}

/** The options of a key listing. */
export interface ListOptions extends CallOptions {
  /** Only the keys that start with it. */
  prefix?: string;
  /** At most this many keys (the server's default 1,000, at most 10,000). */
  limit?: number;
}

/** The headers of a fenced mutation. */
export function writeHeaders(token: string, options: WriteOptions): Record<string, string> {
  const headers: Record<string, string> = { "Fencing-Token": token };
  if (options.seq !== undefined) headers["Fencing-Seq"] = u64Arg("seq", options.seq);
  if (options.idempotencyKey !== undefined) headers["Idempotency-Key"] = options.idempotencyKey;
  if (options.ifMatch !== undefined && options.ifAbsent === true) {
    throw new TypeError("ifMatch and ifAbsent cannot both be given");
  }
  if (options.ifMatch !== undefined) headers["If-Match"] = `"${u64Arg("ifMatch", options.ifMatch)}"`;
  if (options.ifAbsent === true) headers["If-None-Match"] = "*";
  return headers;
}

async function mutate(client: Caller, method: string, lock: string, key: string, token: string, options: WriteOptions, raw?: Uint8Array): Promise<Written> {
  const request = { headers: writeHeaders(token, options), signal: options.signal, retry: "write" as const };
  const answer = await client[CALL](method, kvPath(lock, key), raw === undefined ? request : { ...request, raw });
  const o = answer.object();
  const replayed = (answer.headers.get("idempotent-replayed") ?? "").trim().toLowerCase() === "true";
  return answer.read<Written>({ revision: u64(o.get("revision")), epoch: u64(o.get("epoch")), replayed });
}

export function put(client: Caller, lock: string, key: string, value: Uint8Array | string, token: string, options: WriteOptions): Promise<Written> {
  const raw = typeof value === "string" ? new TextEncoder().encode(value) : value;
  return mutate(client, "PUT", lock, key, token, options, raw);
}

export function del(client: Caller, lock: string, key: string, token: string, options: WriteOptions): Promise<Written> {
  return mutate(client, "DELETE", lock, key, token, options);
}

export async function get(client: Caller, lock: string, key: string, options: CallOptions): Promise<Entry> {
  const answer = await client[CALL]("GET", kvPath(lock, key), { signal: options.signal });
  const etag = answer.headers.get("etag") ?? "";
  const revision = decimalU64(etag.startsWith('"') && etag.endsWith('"') ? etag.slice(1, -1) : etag);
  const epoch = decimalU64(answer.headers.get("fencing-epoch") ?? "");
  if (revision === undefined || epoch === undefined) {
    throw new DecodeError(answer.status, "no ETag or Fencing-Epoch header");
  }
  return Object.freeze({ value: answer.bytes, revision, epoch });
}

export async function list(client: Caller, lock: string, options: ListOptions): Promise<string[]> {
  if (options.limit !== undefined && (!Number.isSafeInteger(options.limit) || options.limit < 1)) {
    throw new RangeError(`limit must be a whole number above 0, not ${options.limit}`);
  }
  const path = `/v1/kv/${segment("lock name", lock)}${query({ prefix: options.prefix, limit: options.limit })}`;
  const answer = await client[CALL]("GET", path, { signal: options.signal });
  const keys = answer.object().get("keys");
  if (!Array.isArray(keys)) throw answer.undecodable();
  return keys.map((k) => str(k) ?? (() => { throw answer.undecodable(); })());
}

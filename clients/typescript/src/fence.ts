// The barrier and what it is checked against (docs/api.md): `fence` advances a
// namespace's high-water mark to the token's epoch without writing data, shutting out
// every older holder; `highWater` reads a namespace's mark; `checkToken` asks the server
// whether a token is genuine and current (a snapshot: only a resource's check at the
// moment of the write fences). Client's fence/highWater/checkToken call these.

import { type Caller, CALL, bool, nullableU64, segment, str, u64Arg } from "./http.js";
import { u64 } from "./json.js";
import type { CallOptions } from "./kv.js";

/** The options of a barrier. */
export interface FenceOptions extends CallOptions {
  /** `Fencing-Seq`, in namespaces whose policy is `sequence`. */
  seq?: bigint;
  /** `Idempotency-Key`: a retry with the same key returns the first outcome. */
  idempotencyKey?: string;
}

/** The answer to a barrier: the namespace's mark, and the token's epoch. */
export interface Fenced {
  readonly lock: string;
  readonly highWater: bigint;
  readonly epoch: bigint;
}

/** A namespace's mark (`highWater` 0 when nothing was ever admitted). */
export interface FenceStatus {
  readonly lock: string;
  readonly highWater: bigint;
  /** The sequence number admitted with `highWater`; null from a server that does not say. */
  readonly seq: bigint | null;
  /** `"epoch"` or `"sequence"`. */
  readonly policy: string;
}

/** The server's reading of a token (POST /v1/tokens/check). */
export type TokenCheck = GenuineToken | NotGenuineToken;

/** A genuine token, with the lock's state now. */
export interface GenuineToken {
      readonly genuine: true;
      readonly lock: string;
      readonly epoch: bigint;
      readonly holder: string;
      readonly keyId: string;
      /** The lock's epoch now (its live lease's, or the last one granted). */
      readonly currentEpoch: bigint;
      /** `epoch == currentEpoch` and no grant above it can have gone unrecorded. */
      readonly current: boolean;
      /** The lock's live lease has this epoch. */
      readonly leaseAlive: boolean;
}

/** A token that is not genuine, with the server's reason (an invalid_token message). */
export interface NotGenuineToken {
  readonly genuine: false;
  readonly reason: string;
}

export async function fence(client: Caller, lock: string, token: string, options: FenceOptions): Promise<Fenced> {
  const headers: Record<string, string> = { "Fencing-Token": token };
  if (options.seq !== undefined) headers["Fencing-Seq"] = u64Arg("seq", options.seq);
  if (options.idempotencyKey !== undefined) headers["Idempotency-Key"] = options.idempotencyKey;
  const answer = await client[CALL]("POST", `/v1/fences/${segment("lock name", lock)}`, { headers, signal: options.signal, retry: "write" });
  const o = answer.object();
  return answer.read<Fenced>({ lock: str(o.get("lock")), highWater: u64(o.get("high_water")), epoch: u64(o.get("epoch")) });
}

export async function highWater(client: Caller, lock: string, options: CallOptions): Promise<FenceStatus> {
  const answer = await client[CALL]("GET", `/v1/fences/${segment("lock name", lock)}`, { signal: options.signal });
  const o = answer.object();
  return answer.read<FenceStatus>({
    lock: str(o.get("lock")),
    highWater: u64(o.get("high_water")),
    seq: nullableU64(o.get("seq")),
    policy: str(o.get("policy")),
  });
}

export async function checkToken(client: Caller, token: string, options: CallOptions): Promise<TokenCheck> {
  const answer = await client[CALL]("POST", "/v1/tokens/check", { json: { token }, signal: options.signal, retry: "safe" });
  const o = answer.object();
  const genuine = bool(o.get("genuine"));
  if (genuine === false) return answer.read<NotGenuineToken>({ genuine, reason: str(o.get("reason")) });
  if (genuine !== true) throw answer.undecodable();
  return answer.read<GenuineToken>({
    genuine,
    lock: str(o.get("lock")),
    epoch: u64(o.get("epoch")),
    holder: str(o.get("holder")),
    keyId: str(o.get("key_id")),
    currentEpoch: u64(o.get("current_epoch")),
    current: bool(o.get("current")),
    leaseAlive: bool(o.get("lease_alive")),
  });
}

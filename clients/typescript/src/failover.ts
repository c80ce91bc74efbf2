// Failover between the endpoints of one deployment, the rule of the Rust, Python, Go and
// Java clients: a call moves on to the next endpoint when the current one could not be
// reached, or answered 503 (unless the call may move on only from an unreachable one: a
// write without an Idempotency-Key, which a replicated node may have applied before its
// 503); when the request was sent and its answer lost, it moves on only if resending
// cannot apply it twice (reads, renewals, releases, token checks, writes carrying an
// Idempotency-Key). An acquisition or a session's creation whose answer was lost is never
// resent: it may have granted. A client given several endpoints puts a fresh
// Idempotency-Key on every fenced write and barrier (client.ts). Calls start at the
// endpoint that answered last.

import type { Request } from "./http.js";

/** How a call may be resent to the next endpoint. */
export type RetryClass = "safe" | "unlessUnknown" | "onlyUnreachable";

/** How one attempt failed: never sent (`unreachable`), answered 503 (`unavailable`), or
 * sent with its answer lost (`unknown`: it may have been applied). */
export type Failure = "unreachable" | "unavailable" | "unknown";

/** Whether a call of class `retry` may move to the next endpoint after `failure`. */
export function mayTryNext(retry: RetryClass, failure: Failure): boolean {
  if (failure === "unreachable") return true;
  if (failure === "unavailable") return retry !== "onlyUnreachable";
  return retry === "safe";
}

/** The retry class of a request: a fenced write is safe with an Idempotency-Key. */
export function retryClass(method: string, request: Request): RetryClass {
  if (request.retry === "write") {
    return request.headers?.["Idempotency-Key"] !== undefined ? "safe" : "onlyUnreachable";
  }
  return request.retry ?? (method === "GET" ? "safe" : "onlyUnreachable");
}

/** Error codes of a connection that was never made (nothing was sent). */
const UNREACHABLE = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
  "ERR_TLS_CERT_ALTNAME_INVALID",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "CERT_HAS_EXPIRED",
]);

/** What a rejected fetch says about the request: `unreachable` when no connection was
 * made, else `unknown`. */
export function classify(err: unknown): Failure {
  for (let e: unknown = err, depth = 0; e !== null && typeof e === "object" && depth < 5; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && UNREACHABLE.has(code)) return "unreachable";
    e = (e as { cause?: unknown }).cause;
  }
  return "unknown";
}

/** The base URLs of one deployment, tried in order from the last one that answered. */
export class Endpoints {
  readonly bases: readonly string[];
  #preferred = 0;

  constructor(bases: readonly string[]) {
    if (bases.length === 0) throw new TypeError("at least one base URL is needed");
    this.bases = Object.freeze([...bases]);
  }

  get several(): boolean {
    return this.bases.length > 1;
  }

  /** The bases, starting at the one that answered last. */
  order(): string[] {
    return [...this.bases.slice(this.#preferred), ...this.bases.slice(0, this.#preferred)];
  }

  prefer(base: string): void {
    this.#preferred = Math.max(0, this.bases.indexOf(base));
  }
}

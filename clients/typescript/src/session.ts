// Sessions (docs/api.md, "Sessions"): one keepalive for many locks. create, get,
// keepAlive and close on the wire, and SessionGuard, a session renewed in the background
// on the schedule Guard uses (renewal.ts), whose AbortSignal aborts when the session is
// lost. Leases join a session through AcquireOptions.session.

import { type Caller, CALL, segment, str, wholeMs } from "./http.js";
import { safeInteger, u64 } from "./json.js";
import type { CallOptions } from "./kv.js";
import { Renewal } from "./renewal.js";

/** A lease in a session. */
export interface SessionLease {
  readonly leaseId: string;
  readonly lock: string;
  readonly epoch: bigint;
}

/** A session; after `close`, `leases` are the ones released. */
export interface Session {
  readonly sessionId: string;
  readonly holder: string;
  readonly ttlMs: number;
  readonly remainingMs: number;
  readonly leases: readonly SessionLease[];
}

/** The settings of a new session. */
export interface SessionOptions extends CallOptions {
  /** Who holds it (required without authentication). */
  holder?: string;
  /** How long it and every lease in it live without a keepalive. */
  ttlMs: number;
}

async function session(client: Caller, method: string, path: string, request: { json?: unknown; signal?: AbortSignal | undefined; retry: "safe" | "unlessUnknown" }): Promise<Session> {
  const answer = await client[CALL](method, path, request);
  const o = answer.object();
  const items = o.get("leases");
  if (!Array.isArray(items)) throw answer.undecodable();
  const leases = items.map((item) => {
    if (!(item instanceof Map)) throw answer.undecodable();
    return answer.read<SessionLease>({ leaseId: str(item.get("lease_id")), lock: str(item.get("lock")), epoch: u64(item.get("epoch")) });
  });
  return answer.read<Session>({
    sessionId: str(o.get("session_id")),
    holder: str(o.get("holder")),
    ttlMs: safeInteger(o.get("ttl_ms")),
    remainingMs: safeInteger(o.get("remaining_ms")),
    leases: Object.freeze(leases),
  });
}

export function createSession(client: Caller, options: SessionOptions): Promise<Session> {
  wholeMs("ttlMs", options.ttlMs);
  const body: Record<string, unknown> = { ttl_ms: options.ttlMs };
  if (options.holder !== undefined && options.holder !== "") body.holder = options.holder;
  return session(client, "POST", "/v1/sessions", { json: body, signal: options.signal, retry: "unlessUnknown" });
}

const sessionPath = (id: string, action = ""): string => `/v1/sessions/${segment("session id", id)}${action}`;

export function getSession(client: Caller, id: string, options: CallOptions): Promise<Session> {
  return session(client, "GET", sessionPath(id), { signal: options.signal, retry: "safe" });
}

export function keepAliveSession(client: Caller, id: string, options: CallOptions): Promise<Session> {
  return session(client, "POST", sessionPath(id, "/keepalive"), { signal: options.signal, retry: "safe" });
}

export function closeSession(client: Caller, id: string, options: CallOptions): Promise<Session> {
  return session(client, "POST", sessionPath(id, "/close"), { signal: options.signal, retry: "safe" });
}

/** A session renewed in the background, every third of its TTL, until
 * {@link SessionGuard.close}, or until a renewal is refused or has failed for a whole TTL
 * (counted from the sending of the last renewal that worked): then `signal` aborts, with
 * the reason as its `reason`, and every lease in the session is gone with it. Made by
 * Client.holdSession; `await using` closes it at the end of the block. */
export class SessionGuard implements AsyncDisposable {
  readonly session: Session;
  /** Aborted when the session is lost; `signal.reason` is why. */
  readonly signal: AbortSignal;
  readonly #client: Caller;
  readonly #renewal: Renewal;
  #closed: Promise<Session> | undefined;

  constructor(client: Caller, session: Session, askedAt: number) {
    this.session = session;
    this.#client = client;
    this.#renewal = new Renewal(session.ttlMs, askedAt, (signal) => keepAliveSession(client, session.sessionId, { signal }));
    this.signal = this.#renewal.signal;
  }

  /** The session's id, for AcquireOptions.session. */
  get id(): string {
    return this.session.sessionId;
  }

  /** Whether the session was lost. */
  get lost(): boolean {
    return this.signal.aborted;
  }

  /** Why the session was lost; undefined while held. */
  get error(): unknown {
    return this.signal.aborted ? (this.signal.reason as unknown) : undefined;
  }

  /** Stops renewing and closes the session, releasing every lease in it at once; resolves
   * with the session whose `leases` were released. Once it was lost: rejects with why.
   * Calling it again returns the same outcome. */
  close(options: CallOptions = {}): Promise<Session> {
    this.#closed ??= (async () => {
      await this.#renewal.stop();
      if (this.signal.aborted) throw this.signal.reason;
      return closeSession(this.#client, this.session.sessionId, options);
    })();
    return this.#closed;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

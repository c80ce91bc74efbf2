// Sessions (docs/api.md, "Sessions"): one keepalive for many locks. create, get,
// keepAlive and close on the wire, and SessionGuard, a session renewed in the background
// on the schedule Guard uses, with the same deadlines (renewal.ts), whose AbortSignal
// aborts when the session is lost. Leases join a session through AcquireOptions.session.

import { type Caller, CALL, segment, str, wholeMs } from "./http.js";
import { safeInteger } from "./json.js";
import type { CallOptions } from "./kv.js";
import { leaseRef } from "./locks.js";
import { DEFAULT_DEADLINES, type Deadlines, Held } from "./renewal.js";

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
  const leases = answer.objects<SessionLease>(o.get("leases"), leaseRef);
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
 * {@link SessionGuard.close}, until a renewal is refused, or until no renewal has
 * succeeded by the renewal deadline (renewal.ts), when the client gives the session up
 * itself: then `signal` aborts, with the reason as its `reason`, and every lease in the
 * session is gone with it. The session's deadlines (`safeUntil`, `safeForMs`,
 * `renewDeadline`, as a Guard's; see Held for what they do not promise) are those of every
 * lease in it. Made by Client.holdSession; `await using` closes it at the end of the
 * block. */
export class SessionGuard extends Held<Session> {
  readonly session: Session;

  /** Starts renewing `session`, whose creation was sent at the monotonic time `askedAt`
   * (performance.now()), on `deadlines` (Client.holdSession gives the client's). */
  constructor(client: Caller, session: Session, askedAt: number, deadlines: Deadlines = DEFAULT_DEADLINES) {
    super(session.ttlMs, askedAt, deadlines, (signal) => keepAliveSession(client, session.sessionId, { signal }), (options) => closeSession(client, session.sessionId, options));
    this.session = session;
  }

  /** The session's id, for AcquireOptions.session. */
  get id(): string {
    return this.session.sessionId;
  }

  /** Stops renewing and closes the session, releasing every lease in it at once; resolves
   * with the session whose `leases` were released. Once it was lost: rejects with why.
   * Calling it again returns the same outcome. */
  close(options: CallOptions = {}): Promise<Session> {
    return this.finish(options);
  }
}

// The lock client: speaks the HTTP API of a Palisade server (docs/api.md) with Node's
// fetch. Its methods are the API's routes (the wire work lives in locks.ts, kv.ts,
// fence.ts, session.ts) and Guard, a lease renewed in the background (renewal.ts). Every
// failure the server answers is a typed error (errors.ts); a request that did not
// complete rejects with fetch's own error, for a mutation an unknown outcome. Given
// several endpoints, a call moves on from one that failed by failover.ts's rule.

import { randomUUID } from "node:crypto";

import { parseError } from "./errors.js";
import { Election, type ElectionOptions } from "./election.js";
import { type EventsOptions, EventStream } from "./events.js";
import { Endpoints, classify, mayTryNext, retryClass } from "./failover.js";
import { type FenceOptions, type Fenced, type FenceStatus, type TokenCheck, checkToken, fence, highWater } from "./fence.js";
import { Answer, CALL, OPEN, type Request } from "./http.js";
import { type CallOptions, type Entry, type ListOptions, type WriteOptions, type Written, del, get, list, put } from "./kv.js";
import {
  type AcquireOptions,
  type Lease,
  type LockPage,
  type LockPageOptions,
  type LockStatus,
  type Proclaimed,
  type Renewed,
  acquire,
  keepAlive,
  lockPage,
  lockStatus,
  proclaim,
  release,
} from "./locks.js";
import { type Deadlines, Held, checkDeadlines } from "./renewal.js";
import { type TlsOptions, tlsDispatcher, tlsFetch } from "./tls.js";
import { type Session, type SessionOptions, SessionGuard, closeSession, createSession, getSession, keepAliveSession } from "./session.js";
import type { KeyListing } from "./token.js";

/** The fetch the client calls: Node's global fetch unless the options name another. */
export type Fetch = (url: string, init: RequestInit) => Promise<Response>;

/** How a Client reaches its server. */
export interface ClientOptions extends TlsOptions {
  /** Sent as `Authorization: Bearer <key>` on every request (a server with
   * authentication). */
  key?: string;
  /** Another fetch (a wrapper, a mock, undici's). */
  fetch?: Fetch;
  /** An undici Dispatcher (an Agent with its own connection settings, a proxy), given to
   * fetch as the `dispatcher` of every request. */
  dispatcher?: object;
  /** How long one request may take, in milliseconds (30,000 by default); an acquisition
   * that waits in line gets its `waitMs` on top. */
  timeoutMs?: number;
  /** How the client's guards and session guards derive their renewal deadline and safe
   * deadline from the TTL (renewal.ts); each field left out takes its default
   * (DEFAULT_DEADLINES: 2/3 of the TTL, 1 % clock drift). Deadlines that cannot hold are
   * a RangeError from the constructor. */
  deadlines?: Partial<Deadlines>;
}

/** A client of one Palisade deployment: one server, or several endpoints of it (the nodes
 * of an etcd-backed deployment), tried by failover.ts's rule. */
export class Client {
  /** The first endpoint's base URL. */
  readonly baseUrl: string;
  /** The deadlines of every Guard and SessionGuard this client makes (ClientOptions). */
  readonly deadlines: Deadlines;
  readonly #endpoints: Endpoints;
  readonly #key: string | undefined;
  readonly #fetch: Fetch;
  readonly #dispatcher: object | undefined;
  readonly #timeoutMs: number;

  /** A client of the server at `baseUrl` (http://127.0.0.1:7070, say), or of the
   * endpoints listed, in order of preference. */
  constructor(baseUrl: string | readonly string[], options: ClientOptions = {}) {
    const bases = (typeof baseUrl === "string" ? [baseUrl] : [...baseUrl]).map(checkBase);
    this.deadlines = checkDeadlines(options.deadlines);
    this.#endpoints = new Endpoints(bases);
    this.baseUrl = bases[0]!;
    this.#key = options.key;
    const tls = tlsDispatcher(options);
    this.#fetch = options.fetch ?? (tls !== undefined ? tlsFetch : (input, init) => fetch(input, init));
    this.#dispatcher = options.dispatcher ?? tls;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
  }

  /** Every endpoint's base URL, in the order given. */
  get endpoints(): readonly string[] {
    return this.#endpoints.bases;
  }

  /** Takes `lock` (POST /v1/locks/{lock}/acquire). Held by another: LockHeldError. */
  acquire(lock: string, options: AcquireOptions): Promise<Lease> {
    return acquire(this, lock, options);
  }

  /** Renews a lease for a full TTL from now; LeaseExpiredError when it is gone. A lease in
   * a session renews its whole session. */
  keepAlive(leaseId: string, options: CallOptions = {}): Promise<Renewed> {
    return keepAlive(this, leaseId, options);
  }

  /** Gives a lease up; the lock passes to the next in line. */
  release(leaseId: string, options: CallOptions = {}): Promise<void> {
    return release(this, leaseId, options);
  }

  /** Replaces the value a lease shows in its lock's status (null clears it); the
   * lease's epoch and deadline do not change. */
  proclaim(leaseId: string, value: Uint8Array | null, options: CallOptions = {}): Promise<Proclaimed> {
    return proclaim(this, leaseId, value, options);
  }

  /** A lock's status (GET /v1/locks/{lock}). */
  lockStatus(lock: string, options: CallOptions = {}): Promise<LockStatus> {
    return lockStatus(this, lock, options);
  }

  /** One page of locks (GET /v1/locks), in name order; pass `next` as `after` for the
   * following page. */
  listLocks(options: LockPageOptions = {}): Promise<LockPage> {
    return lockPage(this, options);
  }

  /** Every lock whose name starts with `prefix`, page after page (`limit` per page). */
  async *locks(options: Omit<LockPageOptions, "after"> = {}): AsyncGenerator<LockStatus, void, undefined> {
    let after: string | undefined;
    for (;;) {
      const page = await lockPage(this, after === undefined ? options : { ...options, after });
      yield* page.locks;
      if (page.next === null) return;
      after = page.next;
    }
  }

  /** Writes `value` under `key` in `lock`'s namespace, fenced by `token`: refused with
   * StaleTokenError once a newer epoch wrote there. A string value is sent as UTF-8. */
  put(lock: string, key: string, value: Uint8Array | string, token: string, options: WriteOptions = {}): Promise<Written> {
    return put(this, lock, key, value, token, options);
  }

  /** Reads `key` in `lock`'s namespace; NotFoundError when it does not exist. */
  get(lock: string, key: string, options: CallOptions = {}): Promise<Entry> {
    return get(this, lock, key, options);
  }

  /** Deletes `key`, fenced like a put; NotFoundError when it does not exist. */
  delete(lock: string, key: string, token: string, options: WriteOptions = {}): Promise<Written> {
    return del(this, lock, key, token, options);
  }

  /** The keys of `lock`'s namespace in key order, at most `limit` (the server's default
   * 1,000). The server has no continuation for this listing: a namespace with more keys
   * than `limit` cannot be read past it (narrow with `prefix`). */
  list(lock: string, options: ListOptions = {}): Promise<string[]> {
    return list(this, lock, options);
  }

  /** The barrier: advances `lock`'s namespace's high-water mark to the token's epoch
   * without writing data, so every older holder's write is refused from now on. */
  fence(lock: string, token: string, options: FenceOptions = {}): Promise<Fenced> {
    return fence(this, lock, token, options);
  }

  /** A namespace's high-water mark and policy (GET /v1/fences/{lock}). */
  highWater(lock: string, options: CallOptions = {}): Promise<FenceStatus> {
    return highWater(this, lock, options);
  }

  /** The server's reading of a token: genuine, and whether it is the lock's current
   * epoch with a live lease. A snapshot: only a resource's check at the write fences. */
  checkToken(token: string, options: CallOptions = {}): Promise<TokenCheck> {
    return checkToken(this, token, options);
  }

  /** The keys whose tokens verify here (GET /v1/keys), for KeyRing.fromListing. */
  async keys(options: CallOptions = {}): Promise<KeyListing> {
    const answer = await this[CALL]("GET", "/v1/keys", { signal: options.signal });
    try {
      const listing = JSON.parse(answer.text()) as KeyListing;
      if (listing !== null && typeof listing === "object" && Array.isArray(listing.keys)) return listing;
    } catch {
      // below
    }
    throw answer.undecodable();
  }

  /** Acquires `lock` and keeps it: the Guard renews the lease every third of its TTL
   * until released, until a renewal is refused, or until the renewal deadline passes
   * without a renewal that worked. */
  async hold(lock: string, options: AcquireOptions): Promise<Guard> {
    const asked = performance.now(); // the lease runs from its grant, which is later
    const lease = await this.acquire(lock, options);
    return new Guard(this, lease, asked);
  }

  /** Opens a session (POST /v1/sessions): one keepalive for many locks. */
  createSession(options: SessionOptions): Promise<Session> {
    return createSession(this, options);
  }

  /** A session's state; SessionExpiredError once it expired or was closed. */
  getSession(sessionId: string, options: CallOptions = {}): Promise<Session> {
    return getSession(this, sessionId, options);
  }

  /** Renews a session and every lease in it for a full TTL from now. */
  keepAliveSession(sessionId: string, options: CallOptions = {}): Promise<Session> {
    return keepAliveSession(this, sessionId, options);
  }

  /** Closes a session, releasing every lease in it at once (they are its `leases`). */
  closeSession(sessionId: string, options: CallOptions = {}): Promise<Session> {
    return closeSession(this, sessionId, options);
  }

  /** Opens a session and keeps it: the SessionGuard renews it every third of its TTL
   * until closed, until a renewal is refused, or until the renewal deadline passes
   * without a renewal that worked. */
  async holdSession(options: SessionOptions): Promise<SessionGuard> {
    const asked = performance.now();
    const session = await createSession(this, options);
    return new SessionGuard(this, session, asked, this.deadlines);
  }

  /** A live stream of the server's events, of one lock, of a prefix, or of all locks;
   * it reconnects by itself and resumes after the last event it delivered (events.ts). */
  events(options: EventsOptions = {}): EventStream {
    return new EventStream(this, options);
  }

  /** The election named `name` (its lock), to campaign in or observe (election.ts). */
  election(name: string, options: ElectionOptions = {}): Election {
    return new Election(this, name, options);
  }

  /** The package's request function (http.ts): the call, over the endpoints. */
  async [CALL](method: string, path: string, request: Request): Promise<Answer> {
    return (await this.#send(method, path, request, false)) as Answer;
  }

  /** The package's stream opener (http.ts): a GET whose body the caller reads. */
  async [OPEN](path: string, request: Request): Promise<Response> {
    return (await this.#send("GET", path, request, true)) as Response;
  }

  async #send(method: string, path: string, request: Request, stream: boolean): Promise<Answer | Response> {
    const headers: Record<string, string> = { ...request.headers };
    if (request.retry === "write" && this.#endpoints.several && headers["Idempotency-Key"] === undefined) {
      // A resend to another node then carries the same key: applied at most once.
      headers["Idempotency-Key"] = randomUUID();
    }
    const retry = retryClass(method, { ...request, headers });
    let body: Uint8Array | string | undefined;
    if (request.json !== undefined) {
      body = JSON.stringify(request.json);
      headers["Content-Type"] = "application/json";
    } else if (request.raw !== undefined) {
      body = request.raw;
      headers["Content-Type"] = "application/octet-stream";
    }
    if (this.#key !== undefined && this.#key !== "") headers.Authorization = `Bearer ${this.#key}`;
    const queue = this.#endpoints.order();
    const resent = new Set<string>();
    let last: unknown;
    for (let base = queue.shift(); base !== undefined; base = queue.shift()) {
      request.signal?.throwIfAborted();
      // A stream's timeout covers the wait for its headers only, then the stream lives on.
      const timer = new AbortController();
      const timeout = setTimeout(
        () => timer.abort(new DOMException("The operation was aborted due to timeout", "TimeoutError")),
        this.#timeoutMs + (request.extraMs ?? 0),
      );
      timeout.unref();
      const init: RequestInit = {
        method,
        headers,
        signal: request.signal === undefined ? timer.signal : AbortSignal.any([request.signal, timer.signal]),
      };
      if (body !== undefined) init.body = body;
      // undici's own option, which RequestInit does not name in every set of types.
      if (this.#dispatcher !== undefined) Object.assign(init, { dispatcher: this.#dispatcher });
      let response: Response;
      let bytes: Uint8Array;
      try {
        response = await this.#fetch(base + path, init);
        if (stream && response.status === 200) {
          clearTimeout(timeout);
          this.#endpoints.prefer(base);
          return response;
        }
        bytes = new Uint8Array(await response.arrayBuffer());
      } catch (err) {
        clearTimeout(timeout);
        if (request.signal?.aborted === true) throw err; // the caller's own abort
        const failure = classify(err);
        if (!this.#endpoints.several || !mayTryNext(retry, failure)) throw err;
        last = err;
        // A keep-alive connection closed between two requests loses exactly one answer:
        // a call safe to resend gets one more try there, after the others.
        if (failure === "unknown" && !resent.has(base)) {
          resent.add(base);
          queue.push(base);
        }
        continue;
      }
      clearTimeout(timeout);
      if (response.status === 503 && this.#endpoints.several && mayTryNext(retry, "unavailable")) {
        last = parseError(response.status, bytes);
        continue;
      }
      this.#endpoints.prefer(base);
      if (response.status !== 200) throw parseError(response.status, bytes);
      return new Answer(response.status, response.headers, bytes);
    }
    throw last;
  }
}

function checkBase(baseUrl: string): string {
  let url: URL;
  try {
    url = new URL(baseUrl);
  } catch {
    throw new TypeError(`base URL ${JSON.stringify(baseUrl)} is not a URL: write http://host:port`);
  }
  if ((url.protocol !== "http:" && url.protocol !== "https:") || url.search !== "" || url.hash !== "") {
    throw new TypeError(`base URL ${JSON.stringify(baseUrl)} must be http(s)://host[:port], without query or fragment`);
  }
  return url.href.replace(/\/+$/, "");
}

/** A lease held and renewed in the background, every third of its TTL, until
 * {@link Guard.release}, until a renewal is refused, or until no renewal has succeeded by
 * the renewal deadline (2/3 of the TTL after the sending of the last renewal that worked,
 * by default; renewal.ts), when the client gives the lease up itself: then `signal`
 * aborts, with the reason as its `reason`. `safeUntil` and `safeForMs` say until when
 * the holder may act (the TTL less a clock-drift margin), `renewDeadline` when it is given
 * up; they narrow the window in which an old holder can still act, and do not close it
 * (see Held). A guard does not stop the work it protects by itself: give `signal` to that
 * work, and let the resource's gate refuse the late writes fencing exists for. The
 * renewal timer does not keep the process alive. Made by {@link Client.hold}; `await
 * using` releases it at the end of the block. */
export class Guard extends Held<void> {
  readonly lease: Lease;

  /** Starts renewing `lease`, whose acquisition was sent at the monotonic time `askedAt`
   * (performance.now()), on the client's deadlines. */
  constructor(client: Client, lease: Lease, askedAt: number) {
    super(lease.ttlMs, askedAt, client.deadlines, (signal) => client.keepAlive(lease.leaseId, { signal }), (options) => client.release(lease.leaseId, options));
    this.lease = lease;
  }

  /** Stops renewing and releases the lease. Once it was lost there is nothing to
   * release: rejects with why it was lost. Calling it again returns the same outcome. */
  release(options: CallOptions = {}): Promise<void> {
    return this.finish(options);
  }
}

// The lock client: speaks the HTTP API of one Palisade server (docs/api.md) with Node's
// fetch: acquire (with a wait in line), keepalive, release, the fenced store's put and
// get, the key listing, and Guard, a lease renewed in the background every third of its
// TTL. Every failure the server answers is a typed error (errors.ts); a request that did
// not complete rejects with fetch's own error, for a mutation an unknown outcome.

import { DecodeError, PalisadeError, parseError } from "./errors.js";
import { type Json, parseJson, safeInteger, u64 } from "./json.js";
import type { KeyListing } from "./token.js";

/** The fetch the client calls: Node's global fetch unless the options name another. */
export type Fetch = (url: string, init: RequestInit) => Promise<Response>;

/** How a Client reaches its server. */
export interface ClientOptions {
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
}

/** Settings every call takes. */
export interface CallOptions {
  /** Aborts the request. */
  signal?: AbortSignal;
}

/** The settings of one acquisition. */
export interface AcquireOptions extends CallOptions {
  /** Who holds the lease (with authentication: a label after the principal's name).
   * Required by a server without authentication. */
  holder?: string;
  /** How long the lease lives without a keepalive, in whole milliseconds (50 to
   * 3,600,000 by default). */
  ttlMs: number;
  /** How long to wait in the lock's first-come first-served line, in milliseconds; 0 (the
   * default) refuses at once with LockHeldError when the lock is held. */
  waitMs?: number;
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
}

/** The answer to a fenced write: the key's new revision and the epoch that wrote it. */
export interface Written {
  readonly revision: bigint;
  readonly epoch: bigint;
}

/** A key of the fenced store: its value, revision, and the epoch that wrote it. */
export interface Entry {
  readonly value: Uint8Array;
  readonly revision: bigint;
  readonly epoch: bigint;
}

/** A client of one Palisade server. */
export class Client {
  readonly baseUrl: string;
  readonly #key: string | undefined;
  readonly #fetch: Fetch;
  readonly #dispatcher: object | undefined;
  readonly #timeoutMs: number;

  /** A client of the server at `baseUrl` (http://127.0.0.1:7070, say). */
  constructor(baseUrl: string, options: ClientOptions = {}) {
    let url: URL;
    try {
      url = new URL(baseUrl);
    } catch {
      throw new TypeError(`base URL ${JSON.stringify(baseUrl)} is not a URL: write http://host:port`);
    }
    if ((url.protocol !== "http:" && url.protocol !== "https:") || url.search !== "" || url.hash !== "") {
      throw new TypeError(`base URL ${JSON.stringify(baseUrl)} must be http(s)://host[:port], without query or fragment`);
    }
    this.baseUrl = url.href.replace(/\/+$/, "");
    this.#key = options.key;
    this.#fetch = options.fetch ?? ((input, init) => fetch(input, init));
    this.#dispatcher = options.dispatcher;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
  }

  /** Takes `lock` (POST /v1/locks/{lock}/acquire). Held by another: LockHeldError. */
  async acquire(lock: string, options: AcquireOptions): Promise<Lease> {
    const { holder, ttlMs, waitMs = 0 } = options;
    wholeMs("ttlMs", ttlMs);
    wholeMs("waitMs", waitMs);
    const body: Record<string, unknown> = { ttl_ms: ttlMs };
    if (holder !== undefined && holder !== "") body.holder = holder;
    if (waitMs > 0) body.wait_ms = waitMs;
    const answer = await this.#call("POST", `/v1/locks/${segment("lock name", lock)}/acquire`, {
      json: body,
      signal: options.signal,
      extraMs: waitMs,
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
    });
  }

  /** Renews a lease for a full TTL from now; LeaseExpiredError when it is gone. */
  async keepAlive(leaseId: string, options: CallOptions = {}): Promise<void> {
    await this.#call("POST", `/v1/leases/${segment("lease id", leaseId)}/keepalive`, options);
  }

  /** Gives a lease up; the lock passes to the next in line. */
  async release(leaseId: string, options: CallOptions = {}): Promise<void> {
    await this.#call("POST", `/v1/leases/${segment("lease id", leaseId)}/release`, options);
  }

  /** Writes `value` under `key` in `lock`'s namespace, fenced by `token`: refused with
   * StaleTokenError once a newer epoch wrote there. A string value is sent as UTF-8. */
  async put(lock: string, key: string, value: Uint8Array | string, token: string, options: CallOptions = {}): Promise<Written> {
    const raw = typeof value === "string" ? new TextEncoder().encode(value) : value;
    const answer = await this.#call("PUT", kvPath(lock, key), {
      raw,
      headers: { "Fencing-Token": token },
      signal: options.signal,
    });
    const o = answer.object();
    return answer.read<Written>({ revision: u64(o.get("revision")), epoch: u64(o.get("epoch")) });
  }

  /** Reads `key` in `lock`'s namespace; NotFoundError when it does not exist. */
  async get(lock: string, key: string, options: CallOptions = {}): Promise<Entry> {
    const answer = await this.#call("GET", kvPath(lock, key), options);
    const etag = answer.headers.get("etag") ?? "";
    const revision = decimalU64(etag.startsWith('"') && etag.endsWith('"') ? etag.slice(1, -1) : etag);
    const epoch = decimalU64(answer.headers.get("fencing-epoch") ?? "");
    if (revision === undefined || epoch === undefined) {
      throw new DecodeError(answer.status, "no ETag or Fencing-Epoch header");
    }
    return Object.freeze({ value: answer.bytes, revision, epoch });
  }

  /** The keys whose tokens verify here (GET /v1/keys), for KeyRing.fromListing. */
  async keys(options: CallOptions = {}): Promise<KeyListing> {
    const answer = await this.#call("GET", "/v1/keys", options);
    try {
      const listing = JSON.parse(answer.text()) as KeyListing;
      if (listing !== null && typeof listing === "object" && Array.isArray(listing.keys)) return listing;
    } catch {
      // below
    }
    throw answer.undecodable();
  }

  /** Acquires `lock` and keeps it: the Guard renews the lease every third of its TTL
   * until released, or until a renewal is refused. */
  async hold(lock: string, options: AcquireOptions): Promise<Guard> {
    const asked = performance.now(); // the lease runs from its grant, which is later
    const lease = await this.acquire(lock, options);
    return new Guard(this, lease, asked);
  }

  async #call(
    method: string,
    path: string,
    request: CallOptions & { json?: unknown; raw?: Uint8Array; headers?: Record<string, string>; extraMs?: number },
  ): Promise<Answer> {
    const headers: Record<string, string> = { ...request.headers };
    let body: Uint8Array | string | undefined;
    if (request.json !== undefined) {
      body = JSON.stringify(request.json);
      headers["Content-Type"] = "application/json";
    } else if (request.raw !== undefined) {
      body = request.raw;
      headers["Content-Type"] = "application/octet-stream";
    }
    if (this.#key !== undefined && this.#key !== "") headers.Authorization = `Bearer ${this.#key}`;
    const timeout = AbortSignal.timeout(this.#timeoutMs + (request.extraMs ?? 0));
    const init: RequestInit = {
      method,
      headers,
      signal: request.signal === undefined ? timeout : AbortSignal.any([request.signal, timeout]),
    };
    if (body !== undefined) init.body = body;
    // undici's own option, which RequestInit does not name in every set of types.
    if (this.#dispatcher !== undefined) Object.assign(init, { dispatcher: this.#dispatcher });
    const response = await this.#fetch(this.baseUrl + path, init);
    const bytes = new Uint8Array(await response.arrayBuffer());
    if (response.status !== 200) throw parseError(response.status, bytes);
    return new Answer(response.status, response.headers, bytes);
  }
}

/** A 200 answer, read strictly: a field missing or of another type is a DecodeError. */
class Answer {
  constructor(
    readonly status: number,
    readonly headers: Headers,
    readonly bytes: Uint8Array,
  ) {}

  text(): string {
    return new TextDecoder().decode(this.bytes);
  }

  undecodable(): DecodeError {
    return new DecodeError(this.status, this.text().slice(0, 200));
  }

  object(): Map<string, Json> {
    let json: Json;
    try {
      json = parseJson(this.text());
    } catch {
      throw this.undecodable();
    }
    if (!(json instanceof Map)) throw this.undecodable();
    return json;
  }

  /** `fields` with every value present, or a DecodeError. */
  read<T extends object>(fields: { [K in keyof T]: T[K] | undefined }): T {
    for (const value of Object.values(fields)) {
      if (value === undefined) throw this.undecodable();
    }
    return Object.freeze(fields) as T;
  }
}

function str(value: Json | undefined): string | undefined {
  return typeof value === "string" ? value : undefined;
}

function decimalU64(text: string): bigint | undefined {
  if (!/^(?:0|[1-9][0-9]*)$/.test(text)) return undefined;
  const n = BigInt(text);
  return n < 1n << 64n ? n : undefined;
}

function wholeMs(what: string, ms: number): void {
  if (!Number.isSafeInteger(ms) || ms < 0) {
    throw new RangeError(`${what} must be a whole number of milliseconds, not ${ms}`);
  }
}

/** Percent-encodes one path segment: every byte outside RFC 3986's unreserved set
 * (A-Z a-z 0-9 - . _ ~) becomes %XX, as the Rust and Python clients send it. */
function encodeSegment(what: string, value: string): string {
  if (value === "." || value === "..") {
    // A URL parser removes dot segments before the request leaves: another route or key.
    throw new TypeError(`${what} ${JSON.stringify(value)} cannot be sent in a URL path`);
  }
  try {
    return encodeURIComponent(value).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
  } catch {
    throw new TypeError(`${what} ${JSON.stringify(value)} is not valid Unicode text`);
  }
}

/** A name that must be exactly one path segment (a lock name, a lease id). */
function segment(what: string, value: string): string {
  if (value === "") throw new TypeError(`${what} must not be empty`);
  return encodeSegment(what, value);
}

/** A key keeps `/` as its separator, each part encoded on its own, so `a/b c` is sent as
 * `a/b%20c` and the server sees the key it was given. */
function kvPath(lock: string, key: string): string {
  if (key === "") throw new TypeError("key must not be empty");
  const parts = key.split("/").map((part) => encodeSegment(`key ${JSON.stringify(key)} has a segment`, part));
  return `/v1/kv/${segment("lock name", lock)}/${parts.join("/")}`;
}

/** A lease held and renewed in the background, every third of its TTL, until
 * {@link Guard.release}, or until a renewal is refused or has failed for a whole TTL:
 * then `signal` aborts, with the reason as its `reason`. A guard does not stop the work
 * it protects by itself: give `signal` to that work, and let the resource's gate refuse
 * the late writes fencing exists for. The renewal timer does not keep the process alive.
 * Made by {@link Client.hold}; `await using` releases it at the end of the block. */
export class Guard implements AsyncDisposable {
  readonly lease: Lease;
  /** Aborted when the lease is lost; `signal.reason` is why. */
  readonly signal: AbortSignal;
  readonly #client: Client;
  readonly #lost = new AbortController();
  readonly #renewing: Promise<void>;
  #stopped = false;
  #wake: (() => void) | undefined;
  #released: Promise<void> | undefined;

  /** Starts renewing `lease`, granted after the monotonic time `askedAt`. */
  constructor(client: Client, lease: Lease, askedAt: number) {
    this.lease = lease;
    this.signal = this.#lost.signal;
    this.#client = client;
    this.#renewing = this.#renew(askedAt);
  }

  /** Whether the lease was lost. */
  get lost(): boolean {
    return this.signal.aborted;
  }

  /** Why the lease was lost (the refusal, or the last failure); undefined while held. */
  get error(): unknown {
    return this.signal.aborted ? this.signal.reason : undefined;
  }

  /** Stops renewing and releases the lease. Once it was lost there is nothing to
   * release: rejects with why it was lost. Calling it again returns the same outcome. */
  release(options: CallOptions = {}): Promise<void> {
    this.#released ??= this.#release(options);
    return this.#released;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }

  async #release(options: CallOptions): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    await this.#renewing;
    if (this.signal.aborted) throw this.signal.reason;
    await this.#client.release(this.lease.leaseId, options);
  }

  async #renew(renewedAt: number): Promise<void> {
    const ttl = this.lease.ttlMs;
    const every = Math.max(1, Math.floor(ttl / 3));
    let next = renewedAt + every;
    for (;;) {
      await this.#sleepUntil(next);
      if (this.#stopped) return;
      const started = performance.now();
      next = started + every;
      try {
        await this.#client.keepAlive(this.lease.leaseId, { signal: AbortSignal.timeout(every) });
        renewedAt = started; // the lease runs a full TTL from a moment after this
      } catch (err) {
        // A refusal is final; a failed request is tried again until the TTL is spent.
        if (err instanceof PalisadeError || performance.now() - renewedAt >= ttl) {
          this.#lost.abort(err);
          return;
        }
      }
    }
  }

  #sleepUntil(at: number): Promise<void> {
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.#wake = undefined;
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, at - performance.now()));
      timer.unref();
      this.#wake = done;
      if (this.#stopped) done();
    });
  }
}

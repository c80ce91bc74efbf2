// The server's live events (GET /v1/events?prefix=, GET /v1/locks/{lock}/events; Server-
// Sent Events) as an async-iterable stream of typed events. The stream reconnects by
// itself when its connection drops or stays silent for 45 s (the server sends a comment
// every 15 s), with the id of the last event it delivered as Last-Event-ID, through the
// client's endpoints like any read; a server that no longer holds what followed (or that
// restarted) answers with a `reset` event first. Failures that may pass (the network, 429
// too many streams, 503) are retried after a pause, 0.1 s doubling to 5 s; a lasting
// refusal (400, 401, 403, 404) ends the stream with its typed error. Memory is bounded:
// the body is read only as events are asked for, a line or an event's data longer than
// 1 MiB is dropped whole, and unknown event types are skipped.

import { PalisadeError, QuotaExceededError, StorageFailedError, UnavailableError } from "./errors.js";
import { type Caller, OPEN, nullableU64, query, segment, str } from "./http.js";
import { type Json, parseJson, safeInteger, u64 } from "./json.js";

/** Silence after which a connection counts as dead, in milliseconds. */
export const IDLE_LIMIT_MS = 45_000;
/** The longest line, and the longest event data, a stream keeps (bytes). */
export const MAX_LINE = 1 << 20;
const FIRST_PAUSE_MS = 100;
const MAX_PAUSE_MS = 5_000;

interface Base {
  /** Increases from event to event, across locks; resume with it. */
  readonly id: bigint;
  /** The server's wall clock, milliseconds since the Unix epoch. */
  readonly atMs: number;
}
/** A lease was granted: `holder` got `epoch` for `ttlMs`. */
export interface GrantedEvent extends Base { readonly type: "granted"; readonly lock: string; readonly epoch: bigint; readonly holder: string; readonly ttlMs: number }
/** The lease of `epoch` ended by release (`cause` "release", or "unknown" over etcd). */
export interface ReleasedEvent extends Base { readonly type: "released"; readonly lock: string; readonly epoch: bigint; readonly holder: string; readonly cause: string }
/** The lease of `epoch` ran out without renewal. */
export interface ExpiredEvent extends Base { readonly type: "expired"; readonly lock: string; readonly epoch: bigint; readonly holder: string }
/** The namespace's high-water mark advanced to (`highWater`, `seq`). */
export interface FencedEvent extends Base { readonly type: "fenced"; readonly lock: string; readonly highWater: bigint; readonly seq: bigint }
/** A mutation was refused with `code`; `epoch` the token's (null when none verified),
 * `highWater` the mark that refused it (null unless stale_token/stale_sequence). */
export interface RejectedEvent extends Base { readonly type: "rejected"; readonly lock: string; readonly code: string; readonly epoch: bigint | null; readonly highWater: bigint | null }
/** Events may be missing (`reason`: unknown_last_event_id, lagged, gap): read the state
 * again. */
export interface ResetEvent extends Base { readonly type: "reset"; readonly reason: string }

/** One event of the stream. */
export type LockEvent = GrantedEvent | ReleasedEvent | ExpiredEvent | FencedEvent | RejectedEvent | ResetEvent;

/** What a stream follows, and from where. */
export interface EventsOptions {
  /** One lock's events (GET /v1/locks/{lock}/events). */
  lock?: string;
  /** The events of every lock whose name starts with it (GET /v1/events); all locks
   * when neither is given. */
  prefix?: string;
  /** Resume after this event id. */
  lastEventId?: bigint;
  /** Ends the stream (the iteration then ends without an error). */
  signal?: AbortSignal;
}

/** The typed event an SSE `data` field carries; null for an unknown type or data that is
 * not an event (skipped, as docs/api.md asks). */
export function parseEvent(data: string): LockEvent | null {
  let json: Json;
  try {
    json = parseJson(data);
  } catch {
    return null;
  }
  if (!(json instanceof Map)) return null;
  const f = (name: string): Json | undefined => json.get(name);
  const base = { id: u64(f("id")), atMs: safeInteger(f("at_ms")) };
  let event: Record<string, unknown>;
  switch (f("type")) {
    case "granted":
      event = { type: "granted", ...base, lock: str(f("lock")), epoch: u64(f("epoch")), holder: str(f("holder")), ttlMs: safeInteger(f("ttl_ms")) };
      break;
    case "released":
      event = { type: "released", ...base, lock: str(f("lock")), epoch: u64(f("epoch")), holder: str(f("holder")), cause: str(f("cause")) };
      break;
    case "expired":
      event = { type: "expired", ...base, lock: str(f("lock")), epoch: u64(f("epoch")), holder: str(f("holder")) };
      break;
    case "fenced":
      event = { type: "fenced", ...base, lock: str(f("lock")), highWater: u64(f("high_water")), seq: u64(f("seq")) };
      break;
    case "rejected":
      event = { type: "rejected", ...base, lock: str(f("lock")), code: str(f("code")), epoch: nullableU64(f("epoch")), highWater: nullableU64(f("high_water")) };
      break;
    case "reset":
      event = { type: "reset", ...base, reason: str(f("reason")) };
      break;
    default:
      return null;
  }
  return Object.values(event).includes(undefined) ? null : (Object.freeze(event) as unknown as LockEvent);
}

/** Splits a text/event-stream byte stream into its events' data; comments and fields
 * other than `data` are ignored. Holds at most `max` bytes of an unfinished line and of an
 * unfinished event's data: anything longer is dropped whole. */
export class SseParser {
  readonly #max: number;
  #line: Uint8Array[] = [];
  #lineLength = 0;
  #skipping = false;
  #data: string[] = [];
  #dataLength = 0;
  #oversized = false;
  readonly #decoder = new TextDecoder();

  constructor(max = MAX_LINE) {
    this.#max = max;
  }

  /** Feeds bytes; returns the data of the events they complete, in order. */
  feed(chunk: Uint8Array): string[] {
    const out: string[] = [];
    let start = 0;
    for (;;) {
      const end = chunk.indexOf(0x0a, start);
      if (end < 0) break;
      const part = chunk.subarray(start, end);
      start = end + 1;
      if (this.#skipping) {
        this.#skipping = false; // the end of a line too long to keep
      } else {
        this.#line.push(part);
        this.#onLine(out);
      }
      this.#line = [];
      this.#lineLength = 0;
    }
    if (!this.#skipping && start < chunk.length) {
      const rest = chunk.slice(start);
      this.#lineLength += rest.length;
      this.#line.push(rest);
      if (this.#lineLength > this.#max) {
        // No event the server sends is this long: drop the line, and its rest too.
        this.#line = [];
        this.#lineLength = 0;
        this.#skipping = true;
      }
    }
    return out;
  }

  #onLine(out: string[]): void {
    const bytes = Buffer.concat(this.#line);
    let line = this.#decoder.decode(bytes);
    if (line.endsWith("\r")) line = line.slice(0, -1);
    if (line === "") {
      if (this.#data.length > 0 && !this.#oversized) out.push(this.#data.join("\n"));
      this.#data = [];
      this.#dataLength = 0;
      this.#oversized = false;
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    if (field !== "data") return;
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    this.#dataLength += value.length + 1;
    if (this.#dataLength > this.#max) {
      this.#data = [];
      this.#oversized = true;
    } else if (!this.#oversized) {
      this.#data.push(value);
    }
  }
}

/** Whether a refused or failed connection may succeed later. */
function worthRetrying(err: unknown): boolean {
  if (!(err instanceof PalisadeError)) return true; // the network, a bad answer
  return err instanceof QuotaExceededError || err instanceof StorageFailedError || err instanceof UnavailableError;
}

/** A live stream of events; `for await` it, and `close()` (or `await using`, or the
 * signal given) ends it. Iterated once: each event is delivered once. */
export class EventStream implements AsyncIterable<LockEvent>, AsyncDisposable {
  /** The id of the last event delivered (sent as Last-Event-ID on a reconnection). */
  lastEventId: bigint | null;
  /** The last failure a reconnection got past (or is waiting out). */
  lastError: unknown = undefined;
  /** How many connections were opened. */
  connections = 0;
  readonly #client: Caller;
  readonly #path: string;
  readonly #closer = new AbortController();
  #reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
  #conn: AbortController | undefined;
  #parser = new SseParser();
  #ready: LockEvent[] = [];
  #pause = FIRST_PAUSE_MS;
  #received = false;
  #ended = false;

  constructor(client: Caller, options: EventsOptions = {}) {
    if (options.lock !== undefined && options.prefix !== undefined) throw new TypeError("give lock or prefix, not both");
    this.#client = client;
    this.#path =
      options.lock !== undefined ? `/v1/locks/${segment("lock name", options.lock)}/events` : `/v1/events${query({ prefix: options.prefix || undefined })}`;
    this.lastEventId = options.lastEventId ?? null;
    if (options.signal !== undefined) {
      if (options.signal.aborted) this.#closer.abort();
      else options.signal.addEventListener("abort", () => void this.close(), { once: true });
    }
  }

  /** Whether the stream has a connection open now. */
  get connected(): boolean {
    return this.#reader !== undefined;
  }

  [Symbol.asyncIterator](): AsyncIterator<LockEvent> {
    return {
      next: () => this.next(),
      return: async () => {
        await this.close();
        return { done: true, value: undefined };
      },
    };
  }

  /** The next event; done once the stream is closed; rejects with the typed error of a
   * lasting refusal (the stream is then closed). */
  async next(): Promise<IteratorResult<LockEvent, undefined>> {
    for (;;) {
      if (this.#ended || this.#closer.signal.aborted) return { done: true, value: undefined };
      const event = this.#ready.shift();
      if (event !== undefined) {
        this.lastEventId = event.id;
        return { done: false, value: event };
      }
      if (this.#reader === undefined) {
        try {
          await this.#connect();
        } catch (err) {
          await this.close();
          throw err;
        }
        continue;
      }
      await this.#read(this.#reader);
    }
  }

  /** Ends the stream and its connection. */
  close(): Promise<void> {
    this.#ended = true;
    this.#closer.abort();
    this.#drop();
    return Promise.resolve();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  async #connect(): Promise<void> {
    for (;;) {
      if (this.#closer.signal.aborted) return;
      const conn = new AbortController();
      const headers: Record<string, string> = { Accept: "text/event-stream", "Cache-Control": "no-cache" };
      if (this.lastEventId !== null) headers["Last-Event-ID"] = this.lastEventId.toString();
      try {
        const response = await this.#client[OPEN](this.#path, {
          headers,
          signal: AbortSignal.any([conn.signal, this.#closer.signal]),
          retry: "safe",
        });
        if (response.body === null) throw new TypeError("the events answer has no body");
        this.#conn = conn;
        this.#reader = response.body.getReader();
        this.#parser = new SseParser();
        this.#received = false;
        this.connections++;
        return;
      } catch (err) {
        if (this.#closer.signal.aborted) return;
        if (!worthRetrying(err)) throw err;
        await this.#sleep(this.#failed(err));
      }
    }
  }

  async #read(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const idle = new Promise<"idle">((resolve) => {
      timer = setTimeout(() => resolve("idle"), IDLE_LIMIT_MS);
    });
    let outcome: Awaited<ReturnType<typeof reader.read>> | "idle" | { error: unknown };
    try {
      outcome = await Promise.race([reader.read(), idle]);
    } catch (error) {
      outcome = { error };
    } finally {
      clearTimeout(timer);
    }
    if (this.#closer.signal.aborted) return;
    if (outcome !== "idle" && !("error" in outcome) && !outcome.done) {
      this.#pause = FIRST_PAUSE_MS;
      this.#received = true;
      for (const data of this.#parser.feed(outcome.value)) {
        const event = parseEvent(data);
        if (event !== null) this.#ready.push(event);
      }
      return;
    }
    // Dropped, ended or silent: reconnect, at once after a connection that carried
    // something, after the retry pause after one that did not.
    const err = outcome === "idle" ? new Error("events stream silent for 45 s") : "error" in outcome ? outcome.error : new Error("events stream ended");
    const received = this.#received;
    this.#drop();
    this.#ready = [];
    const pause = this.#failed(err);
    if (!received) await this.#sleep(pause);
  }

  #failed(err: unknown): number {
    this.lastError = err;
    const pause = this.#pause;
    this.#pause = Math.min(this.#pause * 2, MAX_PAUSE_MS);
    return pause;
  }

  #drop(): void {
    const reader = this.#reader;
    this.#reader = undefined;
    this.#conn?.abort();
    this.#conn = undefined;
    reader?.cancel().catch(() => undefined);
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.#closer.signal.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.#closer.signal.addEventListener("abort", done, { once: true });
    });
  }
}

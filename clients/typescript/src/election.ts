// Leader election on one lock (docs/election.md): the election is the lock named after
// it. A candidate campaigns by acquiring it with its value (what it advertises), waiting
// in the server's first-come first-served line in rounds of at most five minutes; the
// holder leads, its lease's epoch is its term and its token's, and the lock's status shows
// who leads. A Leader is a Guard's lease: renewed in the background, its signal aborted
// when leadership is lost. Winning notifies no resource: a new leader fences every
// resource it guards (Leader.fence) before it acts. An Observer answers the current
// leadership first, then each change, woken by the lock's events (a grant, a release, an
// expiry, a reset) and reading the status every 500 ms in any case.

import type { Client, Guard } from "./client.js";
import { LockHeldError } from "./errors.js";
import type { Fenced } from "./fence.js";
import type { CallOptions, Written, WriteOptions } from "./kv.js";
import type { LockStatus, Proclaimed } from "./locks.js";

/** How often an observer reads the status, in milliseconds, unless told. */
export const DEFAULT_POLL_INTERVAL_MS = 500;
/** The longest one wait in line may be (the server's bound); campaigns wait in rounds. */
const MAX_WAIT_MS = 300_000;

/** An election's settings. */
export interface ElectionOptions {
  /** The leader's lease TTL (10,000 ms by default). */
  ttlMs?: number;
  /** The leader's lock-delay: after its lease expires, nobody leads this long. */
  lockDelayMs?: number;
  /** How often observers read the status (500 ms by default). */
  pollIntervalMs?: number;
  /** Whether observers follow the lock's events (true by default; false: poll only). */
  useEvents?: boolean;
}

/** What a campaign takes. */
export interface CampaignOptions {
  /** The holder's name (required by a server without authentication). */
  candidate?: string;
  /** Give up after this long with the server's LockHeldError; unbounded by default. */
  timeoutMs?: number;
  /** Gives up: the campaign rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Who leads: the holder, its term (its lease's epoch) and what it advertises. */
export interface LeaderInfo {
  readonly holder: string;
  readonly epoch: bigint;
  readonly value: Uint8Array | null;
}

/** The leadership a status shows, or null when nobody leads. */
export function leaderOf(status: LockStatus): LeaderInfo | null {
  if (status.holder === null) return null;
  return Object.freeze({ holder: status.holder, epoch: status.leaseEpoch ?? status.epoch, value: status.value });
}

function sameLeader(a: LeaderInfo | null, b: LeaderInfo | null): boolean {
  if (a === null || b === null) return a === b;
  if (a.holder !== b.holder || a.epoch !== b.epoch) return false;
  if (a.value === null || b.value === null) return a.value === b.value;
  return Buffer.from(a.value).equals(Buffer.from(b.value));
}

const bytesOf = (value: Uint8Array | string): Uint8Array => (typeof value === "string" ? new TextEncoder().encode(value) : value);

/** An election: the lock `name`. */
export class Election {
  readonly name: string;
  readonly #client: Client;
  readonly #ttlMs: number;
  readonly #lockDelayMs: number | undefined;
  readonly #pollMs: number;
  readonly #useEvents: boolean;

  constructor(client: Client, name: string, options: ElectionOptions = {}) {
    this.#client = client;
    this.name = name;
    this.#ttlMs = options.ttlMs ?? 10_000;
    this.#lockDelayMs = options.lockDelayMs;
    this.#pollMs = Math.max(10, options.pollIntervalMs ?? DEFAULT_POLL_INTERVAL_MS);
    this.#useEvents = options.useEvents ?? true;
  }

  /** Waits in line until this candidate leads, advertising `value`. With `timeoutMs`,
   * rejects with LockHeldError once it has passed; other errors as they come (an
   * acquisition whose answer was lost is not resent). */
  async campaign(value: Uint8Array | string, options: CampaignOptions = {}): Promise<Leader> {
    const deadline = options.timeoutMs === undefined ? undefined : performance.now() + options.timeoutMs;
    for (;;) {
      options.signal?.throwIfAborted();
      const waitMs = deadline === undefined ? MAX_WAIT_MS : Math.max(0, Math.min(MAX_WAIT_MS, Math.floor(deadline - performance.now())));
      try {
        const guard = await this.#client.hold(this.name, {
          ttlMs: this.#ttlMs,
          waitMs,
          value: bytesOf(value),
          ...(options.candidate === undefined ? {} : { holder: options.candidate }),
          ...(this.#lockDelayMs === undefined ? {} : { lockDelayMs: this.#lockDelayMs }),
          ...(options.signal === undefined ? {} : { signal: options.signal }),
        });
        return new Leader(this.#client, guard);
      } catch (err) {
        if (!(err instanceof LockHeldError) || (deadline !== undefined && performance.now() >= deadline)) throw err;
      }
    }
  }

  /** Who leads now, if anyone. */
  async leader(options: CallOptions = {}): Promise<LeaderInfo | null> {
    return leaderOf(await this.#client.lockStatus(this.name, options));
  }

  /** An observer of this election's leadership (close it to end its events stream). */
  observe(): Observer {
    return new Observer(this.#client, this.name, this.#pollMs, this.#useEvents);
  }
}

/** This candidate leads: a lease on the election's lock, renewed in the background.
 * `signal` aborts when leadership is lost; not aborted is no permission to act (the
 * lease ends at the server when it expires, whatever this process believes). */
export class Leader implements AsyncDisposable {
  readonly guard: Guard;
  readonly #client: Client;

  constructor(client: Client, guard: Guard) {
    this.#client = client;
    this.guard = guard;
  }

  /** The term: the lease's epoch, also its token's. */
  get term(): bigint {
    return this.guard.lease.epoch;
  }

  /** The fencing token to attach to every write this leader makes. */
  get token(): string {
    return this.guard.lease.token;
  }

  /** Aborted once leadership is lost; `reason` is why. */
  get signal(): AbortSignal {
    return this.guard.signal;
  }

  get lost(): boolean {
    return this.guard.lost;
  }

  /** The barrier on the namespace named after the election: from now on it refuses
   * every earlier leader's writes. Call it before acting. */
  fence(options: CallOptions = {}): Promise<Fenced> {
    return this.#client.fence(this.guard.lease.lock, this.token, options);
  }

  /** A fenced write in the namespace named after the election, with this term's token. */
  put(key: string, value: Uint8Array | string, options: WriteOptions = {}): Promise<Written> {
    return this.#client.put(this.guard.lease.lock, key, value, this.token, options);
  }

  /** Replaces what this leader advertises. */
  proclaim(value: Uint8Array | string, options: CallOptions = {}): Promise<Proclaimed> {
    return this.#client.proclaim(this.guard.lease.leaseId, bytesOf(value), options);
  }

  /** Steps down: the next candidate in line leads at once. Rejects with why when
   * leadership was already lost. */
  resign(options: CallOptions = {}): Promise<void> {
    return this.guard.release(options);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.resign();
  }
}

/** Watches an election: `changed()` answers the current leadership first, then each
 * change (null: nobody leads). It reads the status at once on each grant, release,
 * expiry or reset of the lock's events stream (opened at the first call), and every poll
 * interval in any case, which is all it does while the stream is unavailable. It may miss
 * a leader that came and went between two reads (the epochs show the gap). Also an
 * async iterator of the same answers. */
export class Observer implements AsyncIterable<LeaderInfo | null>, AsyncDisposable {
  readonly #client: Client;
  readonly #lock: string;
  readonly #pollMs: number;
  readonly #useEvents: boolean;
  readonly #closer = new AbortController();
  #seen: { info: LeaderInfo | null } | undefined;
  #started = false;
  #woken = false;
  #wake: (() => void) | undefined;

  constructor(client: Client, lock: string, pollMs: number, useEvents: boolean) {
    this.#client = client;
    this.#lock = lock;
    this.#pollMs = pollMs;
    this.#useEvents = useEvents;
  }

  /** The next leadership that differs from the last one answered (the current one, the
   * first time). With `timeoutMs`, rejects with a TimeoutError once it has passed. */
  async changed(options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<LeaderInfo | null> {
    this.#start();
    const deadline = options.timeoutMs === undefined ? undefined : performance.now() + options.timeoutMs;
    for (;;) {
      this.#closer.signal.throwIfAborted();
      options.signal?.throwIfAborted();
      this.#woken = false;
      const now = leaderOf(await this.#client.lockStatus(this.#lock, options.signal === undefined ? {} : { signal: options.signal }));
      if (this.#seen === undefined || !sameLeader(this.#seen.info, now)) {
        this.#seen = { info: now };
        return now;
      }
      let wait = this.#pollMs;
      if (deadline !== undefined) {
        const left = deadline - performance.now();
        if (left <= 0) throw new DOMException(`no leadership change of ${JSON.stringify(this.#lock)} within ${options.timeoutMs} ms`, "TimeoutError");
        wait = Math.min(wait, left);
      }
      await this.#sleep(wait, options.signal);
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<LeaderInfo | null, void, undefined> {
    try {
      while (!this.#closer.signal.aborted) yield await this.changed();
    } catch (err) {
      if (!this.#closer.signal.aborted) throw err;
    }
  }

  /** Ends the events stream; a pending `changed()` rejects with an AbortError. */
  close(): Promise<void> {
    this.#closer.abort();
    this.#wake?.();
    return Promise.resolve();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #start(): void {
    if (this.#started || !this.#useEvents) return;
    this.#started = true;
    const stream = this.#client.events({ lock: this.#lock, signal: this.#closer.signal });
    void (async () => {
      for await (const event of stream) {
        if (event.type !== "fenced" && event.type !== "rejected") this.#signal();
      }
    })().catch(() => undefined); // a lasting refusal: polling goes on alone
  }

  #signal(): void {
    this.#woken = true;
    this.#wake?.();
  }

  #sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
    if (this.#woken) return Promise.resolve();
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", done);
        this.#wake = undefined;
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal?.addEventListener("abort", done, { once: true });
      this.#wake = done;
    });
  }
}

// The renewal schedule Guard and SessionGuard share (the Python client's): renew every
// third of the TTL; a refusal (any PalisadeError) ends it at once; a failed request is
// tried again until a whole TTL has passed since the sending of the last renewal that
// worked (the lease runs a full TTL from a moment after that sending), then it ends. On
// its end the AbortSignal aborts with the refusal or the last failure as its reason. The
// timer does not keep the process alive. Held is the base both guards extend: the
// renewal, the loss, and the one end (a release, a close) that stops the renewal first.

import { PalisadeError } from "./errors.js";
import type { CallOptions } from "./kv.js";

/** One renewal: resolves when the server renewed, rejects otherwise. */
export type Renew = (signal: AbortSignal) => Promise<unknown>;

/** A lease or session renewed in the background until {@link Renewal.stop}. */
export class Renewal {
  /** Aborted when the lease (or session) is lost; `reason` is why. */
  readonly signal: AbortSignal;
  readonly #lost = new AbortController();
  readonly #done: Promise<void>;
  #stopped = false;
  #wake: (() => void) | undefined;

  /** Starts renewing a lease of `ttlMs` granted after the monotonic time `askedAt`. */
  constructor(ttlMs: number, askedAt: number, renew: Renew) {
    this.signal = this.#lost.signal;
    this.#done = this.#run(ttlMs, askedAt, renew);
  }

  /** Stops renewing; resolves once no renewal is in flight. */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    await this.#done;
  }

  async #run(ttl: number, renewedAt: number, renew: Renew): Promise<void> {
    const every = Math.max(1, Math.floor(ttl / 3));
    let next = renewedAt + every;
    for (;;) {
      await this.#sleepUntil(next);
      if (this.#stopped) return;
      const started = performance.now();
      next = started + every;
      try {
        await renew(AbortSignal.timeout(every));
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

/** A lease or session renewed in the background (a {@link Renewal}) until it is ended
 * with `end` (a release, a close), which resolves with `T`; Guard and SessionGuard. */
export abstract class Held<T> implements AsyncDisposable {
  /** Aborted when the lease (or session) is lost; `signal.reason` is why. */
  readonly signal: AbortSignal;
  readonly #renewal: Renewal;
  readonly #end: (options: CallOptions) => Promise<T>;
  #ended: Promise<T> | undefined;

  /** Starts renewing with `renew` a lease (or session) of `ttlMs` granted after the
   * monotonic time `askedAt`. */
  protected constructor(ttlMs: number, askedAt: number, renew: Renew, end: (options: CallOptions) => Promise<T>) {
    this.#renewal = new Renewal(ttlMs, askedAt, renew);
    this.signal = this.#renewal.signal;
    this.#end = end;
  }

  /** Whether the lease (or session) was lost. */
  get lost(): boolean {
    return this.signal.aborted;
  }

  /** Why the lease (or session) was lost (the refusal, or the last failure); undefined
   * while held. */
  get error(): unknown {
    return this.signal.aborted ? (this.signal.reason as unknown) : undefined;
  }

  /** Stops renewing and ends it. Once it was lost there is nothing to end: rejects with
   * why it was lost. Calling it again returns the same outcome. */
  protected finish(options: CallOptions): Promise<T> {
    this.#ended ??= (async () => {
      await this.#renewal.stop();
      if (this.signal.aborted) throw this.signal.reason;
      return this.#end(options);
    })();
    return this.#ended;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.finish({});
  }
}

// The renewal schedule Guard and SessionGuard share, and the deadlines a holder can trust
// (docs/guarantees.md, "A holder's deadlines narrow the window; they do not close it"),
// as the Rust and Python clients keep them. With `s` the time the last renewal the server
// confirmed was sent (at first, the acquisition's) and `t` the TTL it granted (never more
// than the first): the holder is safe until `s + t·(1 − clockDrift)`, and the renewal
// deadline is `s + t·renewDeadline`. A renewal is due every third of the TTL after the
// last success; a refusal (any PalisadeError) ends the schedule at once; a failed request
// is tried again after a tenth of the TTL (at least 10 ms), and no renewal (nor its wait
// for an answer) goes past the renewal deadline: then the client gives the lease up
// itself. Schedule holds these rules with time passed in (tested with made-up clocks);
// Renewal runs it on performance.now() with a timer that does not keep the process alive
// and aborts its AbortSignal at the end with the refusal or a TimeoutError as its reason;
// Held is the base both guards extend: the renewal, the deadlines, the loss, and the one
// end (a release, a close) that stops the renewal first.

import { LeaseExpiredError, PalisadeError, SessionExpiredError } from "./errors.js";
import type { CallOptions } from "./kv.js";

/** How a client derives a holder's deadlines from the TTL; one value serves every lease
 * and session of a Client (ClientOptions.deadlines). The deadlines narrow the window in
 * which an old holder can still act; only a resource that checks the token closes it. */
export interface Deadlines {
  /** The fraction of the TTL, after the sending of the last renewal the server
   * confirmed, at which the client gives the lease up if no renewal has succeeded since:
   * more than 1/3 (a renewal is sent every third of the TTL) and at most
   * `1 - clockDrift`. Default 2/3, as Kubernetes' renewDeadline (10 s of 15 s). */
  readonly renewDeadline: number;
  /** The largest clock-rate difference assumed between this host and the server, as a
   * fraction from 0 to 0.5: the safe deadline is the TTL less this share. Default 0.01
   * (1 %), twenty times the 500 ppm NTP allows a disciplined clock. */
  readonly clockDrift: number;
}

/** The deadlines a Client uses unless ClientOptions.deadlines says otherwise. */
export const DEFAULT_DEADLINES: Deadlines = Object.freeze({ renewDeadline: 2 / 3, clockDrift: 0.01 });

/** `given` with its missing fields from DEFAULT_DEADLINES, frozen; a RangeError when the
 * deadlines cannot hold (see {@link Deadlines}; NaN is refused). */
export function checkDeadlines(given: Partial<Deadlines> = {}): Deadlines {
  const { renewDeadline = DEFAULT_DEADLINES.renewDeadline, clockDrift = DEFAULT_DEADLINES.clockDrift } = given;
  if (typeof clockDrift !== "number" || !(clockDrift >= 0 && clockDrift <= 0.5)) {
    throw new RangeError(`deadlines.clockDrift ${String(clockDrift)} is outside 0 to 0.5 (a fraction: 0.01 is 1 %)`);
  }
  if (typeof renewDeadline !== "number" || !(renewDeadline > 1 / 3 && renewDeadline <= 1 - clockDrift)) {
    throw new RangeError(
      `deadlines.renewDeadline ${String(renewDeadline)} (a fraction of the TTL) must be more than 1/3, when the first renewal is sent, and at most 1 - clockDrift = ${1 - clockDrift}`,
    );
  }
  return Object.freeze({ renewDeadline, clockDrift });
}

/** The reason of a loss at the renewal deadline. */
const GIVEN_UP = "no renewal succeeded before the renewal deadline";

/** When to renew, until when the holder may act, and when the client gives the lease up:
 * the rules, with every time (milliseconds on one monotonic clock) passed in. */
export class Schedule {
  /** The TTL granted at first; a later answer granting more is not believed. */
  readonly ttlMs: number;
  readonly deadlines: Deadlines;
  /** A renewal is due this long after the sending of the last one that succeeded. */
  readonly periodMs: number;
  /** A failed renewal is tried again this long after it failed. */
  readonly retryMs: number;
  /** The renewal deadline: given up unless a renewal succeeds before it. */
  renewBy: number;
  /** Until when the holder may act. */
  safeUntil: number;
  #next: number;
  #over = false;

  /** The schedule of a lease (or session) of `ttlMs` whose acquisition was sent at
   * `sentAt`. */
  constructor(ttlMs: number, sentAt: number, deadlines: Deadlines = DEFAULT_DEADLINES) {
    this.ttlMs = ttlMs;
    this.deadlines = deadlines;
    this.periodMs = ttlMs / 3;
    this.retryMs = Math.max(ttlMs / 10, 10);
    this.renewBy = sentAt + ttlMs * deadlines.renewDeadline;
    this.safeUntil = sentAt + ttlMs * (1 - deadlines.clockDrift);
    this.#next = sentAt + this.periodMs;
  }

  /** When the next renewal should be sent: never after the renewal deadline. */
  due(): number {
    return Math.min(this.#next, this.renewBy);
  }

  /** Whether the renewal deadline has passed at `now`: the client gives the lease up. */
  givenUp(now: number): boolean {
    return now >= this.renewBy;
  }

  /** How long a renewal sent at `now` may take: past the renewal deadline it is moot. */
  timeoutMs(now: number): number {
    return Math.max(this.renewBy - now, 1);
  }

  /** A renewal sent at `sentAt` succeeded, the server granting `ttlMs`: both deadlines
   * count from that send, with no more than the first TTL. Ignored once it is over. */
  renewed(sentAt: number, ttlMs: number): void {
    if (this.#over) return;
    const granted = Math.min(ttlMs, this.ttlMs);
    this.renewBy = Math.max(this.renewBy, sentAt + granted * this.deadlines.renewDeadline);
    this.safeUntil = Math.max(this.safeUntil, sentAt + granted * (1 - this.deadlines.clockDrift));
    this.#next = sentAt + this.periodMs;
  }

  /** A renewal failed at `now` in a way that leaves the lease possibly alive (no answer, an
   * undecodable one): it is tried again soon, until the renewal deadline. */
  failed(now: number): void {
    this.#next = now + this.retryMs;
  }

  /** No more renewals count (lost, given up, released, closed). `endedBy`, when known: a
   * time by which the lease is over at the server (the send of the renewal it answered
   * lease_expired or session_expired to; the moment of a release or a close): the holder
   * is safe no longer from then. The safe deadline never moves later. */
  end(endedBy?: number): void {
    this.#over = true;
    if (endedBy !== undefined) this.safeUntil = Math.min(this.safeUntil, endedBy);
  }
}

/** One renewal: resolves with the TTL the server granted, rejects otherwise. */
export type Renew = (signal: AbortSignal) => Promise<{ readonly ttlMs: number }>;

/** A lease or session renewed in the background on its {@link Schedule}, with times on
 * the `performance.now()` clock, until {@link Renewal.stop}. */
export class Renewal {
  /** Aborted when the lease (or session) is lost; `reason` is why. */
  readonly signal: AbortSignal;
  readonly #schedule: Schedule;
  readonly #lost = new AbortController();
  readonly #done: Promise<void>;
  #stopped = false;
  #wake: (() => void) | undefined;
  /** Abandons the renewal in flight, if any. */
  #abandon: ((reason: DOMException) => void) | undefined;
  #lastFailure: unknown;

  /** Starts renewing a lease of `ttlMs` whose acquisition was sent at `sentAt`
   * (performance.now()). */
  constructor(ttlMs: number, sentAt: number, deadlines: Deadlines, renew: Renew) {
    this.signal = this.#lost.signal;
    this.#schedule = new Schedule(ttlMs, sentAt, deadlines);
    this.#done = this.#run(renew);
  }

  /** Until when the holder may act (performance.now() milliseconds). */
  get safeUntil(): number {
    return this.#schedule.safeUntil;
  }

  /** When the client gives the lease up unless a renewal succeeds first
   * (performance.now() milliseconds). */
  get renewDeadline(): number {
    return this.#schedule.renewBy;
  }

  /** Whether the lease is lost; past the renewal deadline it is given up now, even if
   * the timer has not fired yet. */
  get lost(): boolean {
    this.#check();
    return this.signal.aborted;
  }

  /** Stops renewing because the lease (or session) is being ended (a release, a close):
   * the holder is safe no longer from now. A renewal in flight is abandoned; resolves once
   * the schedule has stopped. */
  async stop(): Promise<void> {
    this.#check();
    this.#schedule.end(performance.now());
    this.#halt();
    await this.#done;
  }

  async #run(renew: Renew): Promise<void> {
    const schedule = this.#schedule;
    for (;;) {
      await this.#sleepUntil(schedule.due());
      if (this.#over()) return;
      const sent = performance.now();
      if (schedule.givenUp(sent)) return this.#giveUp();
      try {
        const { ttlMs } = await this.#attempt(renew, schedule.timeoutMs(sent));
        if (this.#over()) return;
        if (schedule.givenUp(performance.now())) return this.#giveUp(); // answered too late
        schedule.renewed(sent, ttlMs);
      } catch (err) {
        if (this.#over()) return;
        if (err instanceof PalisadeError) {
          // A refusal is final. lease_expired, session_expired: the lease was over at the
          // server by the time it handled this renewal, which was after its sending.
          const ended = err instanceof LeaseExpiredError || err instanceof SessionExpiredError;
          schedule.end(ended ? sent : undefined);
          this.#lose(err);
          return;
        }
        this.#lastFailure = err;
        const now = performance.now();
        if (schedule.givenUp(now)) return this.#giveUp();
        schedule.failed(now);
      }
    }
  }

  /** One renewal, waited for at most `timeoutMs` (until the renewal deadline) even if
   * `renew` ignores its signal; {@link Renewal.stop} abandons it. */
  async #attempt(renew: Renew, timeoutMs: number): Promise<{ readonly ttlMs: number }> {
    const attempt = new AbortController();
    let abandon: (reason: DOMException) => void = () => undefined;
    const abandoned = new Promise<never>((_, reject) => {
      abandon = (reason) => {
        attempt.abort(reason);
        reject(reason);
      };
    });
    this.#abandon = abandon;
    const timer = setTimeout(() => abandon(new DOMException("the renewal got no answer before the renewal deadline", "TimeoutError")), timeoutMs);
    timer.unref();
    try {
      return await Promise.race([renew(attempt.signal), abandoned]);
    } finally {
      clearTimeout(timer);
      this.#abandon = undefined;
    }
  }

  #over(): boolean {
    return this.#stopped || this.signal.aborted;
  }

  /** Gives the lease up if the renewal deadline has passed and nothing ended it yet. */
  #check(): void {
    if (!this.#over() && this.#schedule.givenUp(performance.now())) this.#giveUp();
  }

  /** The renewal deadline passed: lost, with the last failure (if any) as the cause. The
   * safe deadline stays: what still runs may go on until it. */
  #giveUp(): void {
    const cause = this.#lastFailure;
    this.#schedule.end();
    this.#lose(new DOMException(GIVEN_UP, cause === undefined ? { name: "TimeoutError" } : { name: "TimeoutError", cause }));
  }

  #lose(reason: unknown): void {
    this.#lost.abort(reason);
    this.#halt();
  }

  #halt(): void {
    this.#stopped = true;
    this.#abandon?.(new DOMException("the renewal was stopped", "AbortError"));
    this.#wake?.();
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
 * with `end` (a release, a close), which resolves with `T`; Guard and SessionGuard.
 *
 * Its deadlines, on the `performance.now()` clock in milliseconds: {@link Held.safeUntil}
 * (until when the holder may act) and {@link Held.renewDeadline} (when the client gives
 * the lease up unless a renewal succeeds first). They narrow the window in which an old
 * holder can still act; they do not close it: a process that pauses after it checked
 * {@link Held.safeForMs}, a request already on its way, or clocks that drift apart faster
 * than `clockDrift` can still reach a resource after the lease ended. Only the token,
 * checked by the resource where the write lands, closes it. */
export abstract class Held<T> implements AsyncDisposable {
  /** Aborted when the lease (or session) is lost; `signal.reason` is why. */
  readonly signal: AbortSignal;
  readonly #renewal: Renewal;
  readonly #end: (options: CallOptions) => Promise<T>;
  #ended: Promise<T> | undefined;

  /** Starts renewing with `renew` a lease (or session) of `ttlMs` whose acquisition was
   * sent at the monotonic time `askedAt` (performance.now()), on `deadlines`. */
  protected constructor(ttlMs: number, askedAt: number, deadlines: Deadlines, renew: Renew, end: (options: CallOptions) => Promise<T>) {
    this.#renewal = new Renewal(ttlMs, askedAt, deadlines, renew);
    this.signal = this.#renewal.signal;
    this.#end = end;
  }

  /** Whether the lease (or session) was lost: refused, or given up at the renewal
   * deadline (checked when read, so never later than that deadline). */
  get lost(): boolean {
    return this.#renewal.lost;
  }

  /** Why the lease (or session) was lost (the refusal, or a TimeoutError "no renewal
   * succeeded before the renewal deadline" whose `cause` is the last failure); undefined
   * while held. */
  get error(): unknown {
    return this.lost ? (this.signal.reason as unknown) : undefined;
  }

  /** Until when the holder may act, in `performance.now()` milliseconds: the sending of
   * the last renewal the server confirmed (at first, of the acquisition) plus the TTL it
   * granted less the clock-drift margin (Deadlines.clockDrift). Once the server said the
   * lease (or session) ended, or it was released (closed), it is no later than that
   * moment; given up at the renewal deadline, it still says how long what already runs
   * may go on. It never moves later than a confirmed renewal allows. Not a promise: see
   * the class's comment. */
  get safeUntil(): number {
    return this.#renewal.safeUntil;
  }

  /** Milliseconds from now until {@link Held.safeUntil}; 0 once it has passed. */
  get safeForMs(): number {
    return Math.max(0, this.#renewal.safeUntil - performance.now());
  }

  /** When the client gives the lease (or session) up unless a renewal succeeds first, in
   * `performance.now()` milliseconds: the sending of the last renewal the server confirmed
   * plus Deadlines.renewDeadline of the TTL. */
  get renewDeadline(): number {
    return this.#renewal.renewDeadline;
  }

  /** Stops renewing and ends it; the holder is safe no longer from then on. Once it was
   * lost there is nothing to end: rejects with why it was lost. Calling it again returns
   * the same outcome. */
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

// The renewal schedule of one lease or session, with time passed in: the one owner of its rules.
package dev.palisade.client;

/**
 * When to renew, until when the holder may act, and when the client gives up; times are
 * {@link System#nanoTime()} values passed in by the caller, so the rules are tested with
 * made-up clocks (ScheduleTest), as the Python client's {@code _renewal.py} is.
 *
 * <ul>
 *   <li>A renewal is due every third of the TTL after the last success; a failed one is
 *       retried after a tenth (at least 10 ms), never past the renewal deadline.
 *   <li>Both deadlines count from the <em>send</em> of the last renewal the server confirmed
 *       ({@link Deadlines}), with the TTL it granted but never more than the first TTL.
 *   <li>Once the lease is known to have ended (the server said so, it was released),
 *       nothing may act after that moment: the safe deadline moves back to it.
 * </ul>
 *
 * <p>Not thread-safe: {@link Renewal} guards it.
 */
final class Schedule {
  private final long ttlMs;
  private final long periodNanos;
  private final long retryNanos;
  private final Deadlines deadlines;
  private long renewBy;
  private long safeUntil;
  private long nextAt;

  Schedule(long ttlMs, long sentAt, Deadlines deadlines) {
    this.ttlMs = ttlMs;
    this.deadlines = deadlines;
    this.periodNanos = ttlMs * 1_000_000 / 3;
    this.retryNanos = Math.max(ttlMs * 1_000_000 / 10, 10_000_000);
    this.renewBy = sentAt + deadlines.renewSpanNanos(ttlMs);
    this.safeUntil = sentAt + deadlines.safeSpanNanos(ttlMs);
    this.nextAt = sentAt + periodNanos;
  }

  /** When the next renewal should be sent. */
  long due() {
    return nextAt - renewBy < 0 ? nextAt : renewBy;
  }

  /** Whether the renewal deadline has passed without a success: the client gives up. */
  boolean givenUp(long now) {
    return now - renewBy >= 0;
  }

  /** How long a renewal sent at {@code now} may take: past the renewal deadline it is moot. */
  long timeoutNanos(long now) {
    return Math.max(renewBy - now, 1_000_000);
  }

  /** A renewal sent at {@code sentAt} succeeded and the server granted {@code grantedMs}. */
  void renewed(long sentAt, long grantedMs) {
    long granted = Math.min(grantedMs, ttlMs);
    renewBy = later(renewBy, sentAt + deadlines.renewSpanNanos(granted));
    safeUntil = later(safeUntil, sentAt + deadlines.safeSpanNanos(granted));
    nextAt = sentAt + periodNanos;
  }

  /** A renewal failed in a way that leaves the lease possibly alive: retry soon. */
  void failed(long now) {
    nextAt = now + retryNanos;
  }

  /** The lease is known to be over by {@code at}: nothing may act after it. */
  void ended(long at) {
    if (at - safeUntil < 0) {
      safeUntil = at;
    }
  }

  long renewBy() {
    return renewBy;
  }

  long safeUntil() {
    return safeUntil;
  }

  private static long later(long a, long b) {
    return a - b < 0 ? b : a;
  }
}

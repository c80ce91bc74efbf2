// How a client derives a holder's deadlines from the TTL: the settings and their checks.
package dev.palisade.client;

/**
 * How a client derives a holder's two deadlines from the TTL. With {@code s} the time the
 * last renewal the server confirmed was <em>sent</em> and {@code t} the TTL it granted:
 *
 * <ul>
 *   <li><b>safe until</b> {@code s + t * (1 - clockDrift)}: until when the holder may act.
 *       The server counts the lease from when it handled that request, after {@code s}, so
 *       while the two clocks run apart by less than {@code clockDrift} the lease is alive at
 *       the server until then.
 *   <li><b>renewal deadline</b> {@code s + t * renewDeadline}: if no renewal has succeeded
 *       by then, the client gives the lease up itself, as Kubernetes' leader election does at
 *       its {@code renewDeadline}.
 * </ul>
 *
 * <p>The deadlines narrow the window in which an old holder can still act; they do not close
 * it. A holder that checked {@link Guard#safeFor()} and then paused, a request already on its
 * way, or clocks drifting apart faster than {@code clockDrift} still reach the resource after
 * the lease ended: only the token, checked where the write lands, refuses them
 * (docs/guarantees.md, "A holder's deadlines narrow the window; they do not close it").
 *
 * @param renewDeadline the fraction of the TTL after the last confirmed renewal's send at
 *     which the client gives up: more than 1/3 (a renewal is sent every third of the TTL)
 *     and at most {@code 1 - clockDrift}
 * @param clockDrift the largest clock-rate difference assumed between this host and the
 *     server, as a fraction from 0 to 0.5
 */
public record Deadlines(double renewDeadline, double clockDrift) {
  /** 2/3 of the TTL (Kubernetes: 10 s of 15 s) and 1 % drift, twenty times NTP's 500 ppm. */
  public static final Deadlines DEFAULT = new Deadlines(2.0 / 3.0, 0.01);

  /** Refuses settings that cannot hold, with {@link IllegalArgumentException}. */
  public Deadlines {
    if (!(clockDrift >= 0.0 && clockDrift <= 0.5)) {
      throw new IllegalArgumentException(
          "clock drift " + clockDrift + " is outside 0 ..= 0.5 (a fraction: 0.01 is 1 %)");
    }
    if (!(renewDeadline > 1.0 / 3.0 && renewDeadline <= 1.0 - clockDrift)) {
      throw new IllegalArgumentException(
          "renewal deadline " + renewDeadline + " (a fraction of the TTL) must be more than 1/3, "
              + "when the first renewal is sent, and at most 1 - clock drift = " + (1.0 - clockDrift));
    }
  }

  /** From a confirmed renewal's send to the safe deadline, in nanoseconds. */
  long safeSpanNanos(long ttlMs) {
    return (long) (ttlMs * 1_000_000.0 * (1.0 - clockDrift));
  }

  /** From a confirmed renewal's send to the renewal deadline, in nanoseconds. */
  long renewSpanNanos(long ttlMs) {
    return (long) (ttlMs * 1_000_000.0 * renewDeadline);
  }
}

// The settings of one acquisition.
package dev.palisade.client;

import java.time.Duration;
import java.util.Objects;

/**
 * The settings of one acquisition, immutable: start from {@link #ttl(Duration)} (or {@link
 * #inSession(String)}) and add what you need, {@code
 * AcquireOptions.ttl(Duration.ofSeconds(10)).holder("worker-1")}.
 */
public final class AcquireOptions {
  final Duration ttl;
  final String holder;
  final Duration wait;
  final Duration lockDelay;
  final byte[] value;
  final String session;

  private AcquireOptions(
      Duration ttl, String holder, Duration wait, Duration lockDelay, byte[] value, String session) {
    this.ttl = ttl;
    this.holder = holder;
    this.wait = wait;
    this.lockDelay = lockDelay;
    this.value = value;
    this.session = session;
  }

  /** A lease that lives {@code ttl} without a keepalive (whole milliseconds). */
  public static AcquireOptions ttl(Duration ttl) {
    return new AcquireOptions(Objects.requireNonNull(ttl, "ttl"), null, Duration.ZERO, null, null, null);
  }

  /**
   * A lease inside session {@code sessionId}: it takes the session's TTL, is renewed by
   * the session's keepalives and ends with it.
   */
  public static AcquireOptions inSession(String sessionId) {
    return new AcquireOptions(null, null, Duration.ZERO, null, null, Objects.requireNonNull(sessionId, "sessionId"));
  }

  /** Who holds the lease (with authentication: a label after the principal's name). */
  public AcquireOptions holder(String holder) {
    return new AcquireOptions(ttl, holder, wait, lockDelay, value, session);
  }

  /**
   * Waits up to {@code wait} in the lock's first-come first-served line; zero (the default)
   * refuses at once with {@link PalisadeException.LockHeld} when the lock is held.
   */
  public AcquireOptions waitUpTo(Duration wait) {
    return new AcquireOptions(ttl, holder, Objects.requireNonNull(wait, "wait"), lockDelay, value, session);
  }

  /** How long the lock stays closed if this lease expires (default: the server's). */
  public AcquireOptions lockDelay(Duration lockDelay) {
    return new AcquireOptions(ttl, holder, wait, lockDelay, value, session);
  }

  /** What the holder advertises while it holds the lock (a leader's address, say). */
  public AcquireOptions value(byte[] value) {
    return new AcquireOptions(ttl, holder, wait, lockDelay, value == null ? null : value.clone(), session);
  }
}

// The settings of one acquisition.
package dev.palisade.client;

import java.time.Duration;
import java.util.Objects;

/**
 * The settings of one acquisition, immutable: start from {@link #ttl(Duration)} and add
 * what you need, {@code AcquireOptions.ttl(Duration.ofSeconds(10)).holder("worker-1")}.
 */
public final class AcquireOptions {
  final Duration ttl;
  final String holder;
  final Duration wait;
  final Duration lockDelay;
  final byte[] value;

  private AcquireOptions(Duration ttl, String holder, Duration wait, Duration lockDelay, byte[] value) {
    this.ttl = Objects.requireNonNull(ttl, "ttl");
    this.holder = holder;
    this.wait = wait;
    this.lockDelay = lockDelay;
    this.value = value;
  }

  /** A lease that lives {@code ttl} without a keepalive (whole milliseconds). */
  public static AcquireOptions ttl(Duration ttl) {
    return new AcquireOptions(ttl, null, Duration.ZERO, null, null);
  }

  /** Who holds the lease (with authentication: a label after the principal's name). */
  public AcquireOptions holder(String holder) {
    return new AcquireOptions(ttl, holder, wait, lockDelay, value);
  }

  /**
   * Waits up to {@code wait} in the lock's first-come first-served line; zero (the default)
   * refuses at once with {@link PalisadeException.LockHeld} when the lock is held.
   */
  public AcquireOptions waitUpTo(Duration wait) {
    return new AcquireOptions(ttl, holder, Objects.requireNonNull(wait, "wait"), lockDelay, value);
  }

  /** How long the lock stays closed if this lease expires (default: the server's). */
  public AcquireOptions lockDelay(Duration lockDelay) {
    return new AcquireOptions(ttl, holder, wait, lockDelay, value);
  }

  /** What the holder advertises while it holds the lock (a leader's address, say). */
  public AcquireOptions value(byte[] value) {
    return new AcquireOptions(ttl, holder, wait, lockDelay, value == null ? null : value.clone());
  }
}

// What LeaseGuard and SessionGuard share: the background renewal, the loss, the close.
package dev.palisade.client;

import java.io.IOException;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;

/**
 * Holds something with a TTL (a lease, a session) and renews it on a daemon thread until
 * {@link #close()}, which ends it, or until it is lost (see {@link Renewal}).
 */
abstract class Guard implements AutoCloseable {
  private final Renewal renewal;
  private final String what;
  private final Renewal.End end;

  /**
   * Starts renewing on the thread {@code thread} what a request sent at {@code sentAt}
   * ({@link System#nanoTime()}) was granted; {@code what} names the held thing in an
   * interrupt's message, and {@code end} ends it on close.
   */
  Guard(
      String thread, long ttlMs, long sentAt, Deadlines deadlines, Renewal.Renew renew, String what,
      Renewal.End end) {
    this.renewal = new Renewal(thread, ttlMs, sentAt, deadlines, renew);
    this.what = what;
    this.end = end;
  }

  /**
   * Completes, with the refusal or the last failure, when the held lease or session may
   * have ended (and another holder may have its lock). Never completes while it is held.
   */
  public CompletableFuture<IOException> lost() {
    return renewal.lost();
  }

  /**
   * Whether the held lease or session is known or presumed lost: a renewal was refused, or
   * none succeeded before the renewal deadline and the client gave it up.
   */
  public boolean isLost() {
    return renewal.isLost();
  }

  /**
   * Until when the holder may act, on the {@link System#nanoTime()} clock: the send time of
   * the last renewal the server confirmed plus the TTL less the clock-drift margin ({@link
   * Deadlines}). In the past once the server said it ended or it was closed. After the client
   * gave up at the renewal deadline it still says how long what already runs may go on. It
   * narrows the window in which a late write can happen; only the token closes it.
   */
  public long safeUntilNanos() {
    return renewal.safeUntil();
  }

  /** How long from now the holder may still act: zero once {@link #safeUntilNanos()} passed. */
  public Duration safeFor() {
    return Duration.ofNanos(Math.max(0, renewal.safeUntil() - System.nanoTime()));
  }

  /**
   * When the client gives up unless a renewal succeeds first ({@link System#nanoTime()}
   * clock): the last confirmed renewal's send plus {@link Deadlines#renewDeadline()} of the
   * TTL.
   */
  public long renewDeadlineNanos() {
    return renewal.renewDeadline();
  }

  /**
   * Stops renewing and ends what is held (releases the lease, closes the session and with
   * it every lease in it); throws the reason instead when it was lost (there is nothing to
   * end then). An interrupt while ending is an {@link java.io.InterruptedIOException} (with
   * the thread's interrupt status kept): the outcome is then unknown, and what was held
   * ends at its TTL at the latest.
   */
  @Override
  public void close() throws IOException {
    renewal.finish(what, end);
  }
}

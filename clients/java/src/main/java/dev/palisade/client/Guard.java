// What LeaseGuard and SessionGuard share: the background renewal, the loss, the close.
package dev.palisade.client;

import java.io.IOException;
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
   * Starts renewing on the thread {@code thread}; {@code what} names the held thing in an
   * interrupt's message, and {@code end} ends it on close.
   */
  Guard(String thread, long ttlMs, Renewal.Renew renew, String what, Renewal.End end) {
    this.renewal = new Renewal(thread, ttlMs, renew);
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

  /** Whether the held lease or session is known lost. */
  public boolean isLost() {
    return renewal.isLost();
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

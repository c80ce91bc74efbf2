// A held lease renewed in the background, released on close.
package dev.palisade.client;

import java.io.IOException;
import java.util.concurrent.CompletableFuture;

/**
 * Holds a lease and renews it on a daemon thread every third of its TTL, until {@link
 * #close()}, or until a renewal is refused or has failed for a whole TTL (counted from the
 * sending of the last renewal that worked): then the lease is lost and {@link #lost()}
 * completes with why. A guard does not stop the work it protects
 * by itself: watch {@link #lost()}, and let the resource's gate refuse the late writes
 * fencing exists for.
 *
 * <pre>{@code
 * try (LeaseGuard guard = client.hold("orders", AcquireOptions.ttl(Duration.ofSeconds(10)))) {
 *   client.put("orders", "total", bytes, guard.lease().token());
 * }
 * }</pre>
 */
public final class LeaseGuard implements AutoCloseable {
  private final PalisadeClient client;
  private final Lease lease;
  private final Renewal renewal;

  LeaseGuard(PalisadeClient client, Lease lease) {
    this.client = client;
    this.lease = lease;
    this.renewal =
        new Renewal("palisade-lease-" + lease.lock(), lease.ttlMs(), timeout -> client.keepAlive(lease.leaseId(), timeout));
  }

  /** The lease held: its epoch, token and id. */
  public Lease lease() {
    return lease;
  }

  /**
   * Completes, with the refusal or the last failure, when the lease may have ended and
   * another holder may have the lock. Never completes while the lease is held.
   */
  public CompletableFuture<IOException> lost() {
    return renewal.lost();
  }

  /** Whether the lease is known lost. */
  public boolean isLost() {
    return renewal.isLost();
  }

  /**
   * Stops renewing and releases the lease; throws the reason instead when it was lost
   * (there is nothing to release then). An interrupt while releasing is an {@link
   * InterruptedIOException} (with the thread's interrupt status kept): the release's
   * outcome is then unknown, and the lease ends at its TTL at the latest.
   */
  @Override
  public void close() throws IOException {
    renewal.finish("lease " + lease.leaseId(), () -> client.release(lease.leaseId()));
  }
}

// A held lease renewed in the background, released on close.
package dev.palisade.client;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Holds a lease and renews it on a daemon thread every third of its TTL, until {@link
 * #close()}, or until a renewal is refused or has failed for a whole TTL: then the lease is
 * lost and {@link #lost()} completes with why. A guard does not stop the work it protects
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
  private final CompletableFuture<IOException> lost = new CompletableFuture<>();
  private final CountDownLatch stop = new CountDownLatch(1);
  private final Thread renewer;

  LeaseGuard(PalisadeClient client, Lease lease) {
    this.client = client;
    this.lease = lease;
    this.renewer = new Thread(this::renew, "palisade-lease-" + lease.lock());
    renewer.setDaemon(true);
    renewer.start();
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
    return lost.copy();
  }

  /** Whether the lease is known lost. */
  public boolean isLost() {
    return lost.isDone();
  }

  private void renew() {
    long ttlMs = lease.ttlMs();
    Duration every = Duration.ofMillis(Math.max(1, ttlMs / 3));
    long renewed = System.nanoTime();
    try {
      while (!stop.await(every.toMillis(), TimeUnit.MILLISECONDS)) {
        try {
          client.keepAlive(lease.leaseId(), every);
          renewed = System.nanoTime();
        } catch (PalisadeException refused) {
          lost.complete(refused); // a refusal is final
          return;
        } catch (IOException failed) {
          // A failed request is retried until the TTL is spent.
          if (System.nanoTime() - renewed >= TimeUnit.MILLISECONDS.toNanos(ttlMs)) {
            lost.complete(failed);
            return;
          }
        }
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /**
   * Stops renewing and releases the lease; throws the reason instead when it was lost
   * (there is nothing to release then). An interrupt while releasing is an {@link
   * InterruptedIOException} (with the thread's interrupt status kept): the release's
   * outcome is then unknown, and the lease ends at its TTL at the latest.
   */
  @Override
  public void close() throws IOException {
    stop.countDown();
    try {
      renewer.join();
      if (lost.isDone()) {
        throw lost.join();
      }
      client.release(lease.leaseId());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("interrupted while releasing lease " + lease.leaseId());
    }
  }
}

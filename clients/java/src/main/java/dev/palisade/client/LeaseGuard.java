// A held lease renewed in the background, released on close.
package dev.palisade.client;

/**
 * Holds a lease and renews it on a daemon thread every third of its TTL, until {@link
 * #close()}, which releases it, or until a renewal is refused or none has succeeded before
 * the renewal deadline ({@link Deadlines}, counted from the sending of the last renewal that
 * worked): then the lease is lost and
 * {@link #lost()} completes with why. A guard does not stop the work it protects by itself:
 * watch {@link #lost()}, and let the resource's gate refuse the late writes fencing exists
 * for.
 *
 * <pre>{@code
 * try (LeaseGuard guard = client.hold("orders", AcquireOptions.ttl(Duration.ofSeconds(10)))) {
 *   client.put("orders", "total", bytes, guard.lease().token());
 * }
 * }</pre>
 */
public final class LeaseGuard extends Guard {
  private final Lease lease;

  LeaseGuard(PalisadeClient client, Lease lease, long sentAt) {
    super(
        "palisade-lease-" + lease.lock(),
        lease.ttlMs(),
        sentAt,
        client.deadlines(),
        timeout -> {
          client.keepAlive(lease.leaseId(), timeout);
          return lease.ttlMs(); // a lease is renewed for its own TTL
        },
        "lease " + lease.leaseId(),
        () -> client.release(lease.leaseId()));
    this.lease = lease;
  }

  /** The lease held: its epoch, token and id. */
  public Lease lease() {
    return lease;
  }
}

// A session: one keepalive for many locks.
package dev.palisade.client;

import java.util.List;

/**
 * A session ({@code POST /v1/sessions}): one keepalive renews every lease in it; closing it
 * releases them all at once.
 *
 * @param sessionId its id
 * @param holder who holds it
 * @param ttlMs its TTL
 * @param remainingMs how long it has left without a keepalive
 * @param leases the leases in it (for a close: the ones released)
 */
public record Session(String sessionId, String holder, long ttlMs, long remainingMs, List<Member> leases) {
  /** One lease of a session. */
  public record Member(String leaseId, String lock, long epoch) {}

  public Session {
    leases = List.copyOf(leases);
  }
}

// A held session renewed in the background, closed on close.
package dev.palisade.client;

/**
 * Holds a session and renews it (and with it every lease in it) on a daemon thread every
 * third of its TTL, until {@link #close()}, which closes the session and releases its
 * leases, or until a renewal is refused or none has succeeded before the renewal deadline
 * ({@link Deadlines}): then {@link #lost()} completes with why, and every lease in the
 * session may have ended.
 *
 * <pre>{@code
 * try (SessionGuard session = client.holdSession("worker-1", Duration.ofSeconds(10))) {
 *   Lease a = client.acquire("orders", AcquireOptions.inSession(session.id()).holder("worker-1"));
 *   Lease b = client.acquire("invoices", AcquireOptions.inSession(session.id()).holder("worker-1"));
 *   ...
 * }
 * }</pre>
 */
public final class SessionGuard extends Guard {
  private final Session session;

  SessionGuard(PalisadeClient client, Session session, long sentAt) {
    super(
        "palisade-session-" + session.sessionId(),
        session.ttlMs(),
        sentAt,
        client.deadlines(),
        timeout -> client.keepAliveSession(session.sessionId(), timeout).ttlMs(),
        "session " + session.sessionId(),
        () -> client.closeSession(session.sessionId()));
    this.session = session;
  }

  /** The session's id, for {@link AcquireOptions#inSession}. */
  public String id() {
    return session.sessionId();
  }

  /** The session as it was opened. */
  public Session session() {
    return session;
  }
}

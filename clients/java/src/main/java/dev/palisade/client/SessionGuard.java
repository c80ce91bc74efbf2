// A held session renewed in the background, closed on close.
package dev.palisade.client;

import java.io.IOException;
import java.util.concurrent.CompletableFuture;

/**
 * Holds a session and renews it (and with it every lease in it) on a daemon thread every
 * third of its TTL, until {@link #close()}, which closes the session and releases its
 * leases, or until a renewal is refused or has failed for a whole TTL: then {@link #lost()}
 * completes with why, and every lease in the session may have ended.
 *
 * <pre>{@code
 * try (SessionGuard session = client.holdSession("worker-1", Duration.ofSeconds(10))) {
 *   Lease a = client.acquire("orders", AcquireOptions.inSession(session.id()).holder("worker-1"));
 *   Lease b = client.acquire("invoices", AcquireOptions.inSession(session.id()).holder("worker-1"));
 *   ...
 * }
 * }</pre>
 */
public final class SessionGuard implements AutoCloseable {
  private final PalisadeClient client;
  private final Session session;
  private final Renewal renewal;

  SessionGuard(PalisadeClient client, Session session) {
    this.client = client;
    this.session = session;
    this.renewal =
        new Renewal(
            "palisade-session-" + session.sessionId(),
            session.ttlMs(),
            timeout -> client.keepAliveSession(session.sessionId(), timeout));
  }

  /** The session's id, for {@link AcquireOptions#inSession}. */
  public String id() {
    return session.sessionId();
  }

  /** The session as it was opened. */
  public Session session() {
    return session;
  }

  /** Completes, with the refusal or the last failure, when the session may have ended. */
  public CompletableFuture<IOException> lost() {
    return renewal.lost();
  }

  /** Whether the session is known lost. */
  public boolean isLost() {
    return renewal.isLost();
  }

  /**
   * Stops renewing and closes the session, releasing every lease in it; throws the reason
   * instead when it was lost.
   */
  @Override
  public void close() throws IOException {
    renewal.finish("session " + session.sessionId(), () -> client.closeSession(session.sessionId()));
  }
}

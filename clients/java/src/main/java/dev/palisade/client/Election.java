// Leader election: campaign, lead with a fencing token, observe, resign (docs/election.md).
package dev.palisade.client;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * An election is a lock: every replica campaigns for it, the holder leads, the others wait
 * in line; the leader's epoch is its term and its fencing token (docs/election.md). Nothing
 * is election-specific on the server.
 *
 * <pre>{@code
 * Election election = new Election(client, "billing-primary", Duration.ofSeconds(10));
 * try (Election.Leader leader = election.campaign("replica-a", address)) {
 *   leader.fence();                      // before acting: every older leader is shut out
 *   serveAsPrimary(leader.token(), leader.lost());
 * }                                      // resigns: the next candidate leads at once
 * }</pre>
 */
public final class Election {
  /** How long one campaign request waits in line before it asks again. */
  static final Duration ROUND = Duration.ofMinutes(5);
  private static final long POLL_MS = 500;

  private final PalisadeClient client;
  private final String name;
  private final Duration ttl;

  /** The election held on lock {@code name}, with leaders' leases of {@code ttl}. */
  public Election(PalisadeClient client, String name, Duration ttl) {
    this.client = client;
    this.name = name;
    this.ttl = ttl;
  }

  /**
   * Waits in line, as long as it takes, until {@code candidate} leads; {@code value} is what
   * it advertises. The returned leader renews its lease in the background.
   */
  public Leader campaign(String candidate, byte[] value) throws IOException, InterruptedException {
    AcquireOptions options = AcquireOptions.ttl(ttl).holder(candidate).value(value).waitUpTo(ROUND);
    while (true) {
      try {
        long sentAt = System.nanoTime();
        return new Leader(client, name, client.guard(client.acquire(name, options), sentAt));
      } catch (PalisadeException.LockHeld round) {
        // One round of waiting ended with somebody else still leading: wait again.
      }
    }
  }

  /** Watches who leads, without campaigning. */
  public Observer observe() {
    return new Observer(client, name);
  }

  /** The leadership now: empty while nobody leads. */
  public Optional<Leadership> leadership() throws IOException, InterruptedException {
    return Observer.read(client, name);
  }

  /** This replica leading: its term, its token, and when it stops leading. */
  public static final class Leader implements AutoCloseable {
    private final PalisadeClient client;
    private final String name;
    private final LeaseGuard guard;

    Leader(PalisadeClient client, String name, LeaseGuard guard) {
      this.client = client;
      this.name = name;
      this.guard = guard;
    }

    /** The leader's term: its lease's epoch. */
    public long term() {
      return guard.lease().epoch();
    }

    /** The fencing token every write of this leader carries. */
    public String token() {
      return guard.lease().token();
    }

    /** The lease behind the leadership. */
    public Lease lease() {
      return guard.lease();
    }

    /** Completes when the lease may be lost: stop acting at once, someone else may lead. */
    public CompletableFuture<IOException> lost() {
      return guard.lost();
    }

    /**
     * The barrier on the built-in store's namespace of the election: every older leader's
     * later write there is refused from now on. Resources of your own need an admit of this
     * token through their gate.
     */
    public Fenced fence() throws IOException, InterruptedException {
      return client.fence(name, token(), PutOptions.none());
    }

    /** Replaces what this leader advertises; the term does not change. */
    public void proclaim(byte[] value) throws IOException, InterruptedException {
      client.proclaim(guard.lease().leaseId(), value);
    }

    /** Steps down: the next candidate in line leads at once, with the next term. */
    public void resign() throws IOException {
      guard.close();
    }

    @Override
    public void close() throws IOException {
      resign();
    }
  }

  /**
   * Watches an election: {@link #changed} answers the current leadership the first time,
   * then waits for the next change (another leader, a new term, a new value, or nobody).
   * It hears of changes of holder from the lock's event stream and reads the lock's status
   * every 500 ms in any case.
   */
  public static final class Observer implements AutoCloseable {
    private final PalisadeClient client;
    private final String name;
    private final EventStream events;
    private final Semaphore wake = new Semaphore(0);
    private final Thread listener;
    private boolean first = true;
    private Optional<Leadership> last = Optional.empty();

    Observer(PalisadeClient client, String name) {
      this.client = client;
      this.name = name;
      this.events = client.lockEvents(name);
      this.listener = new Thread(this::listen, "palisade-election-" + name);
      listener.setDaemon(true);
      listener.start();
    }

    /** The next leadership, waiting as long as it takes. */
    public Optional<Leadership> changed() throws IOException, InterruptedException {
      while (true) {
        try {
          return changed(Duration.ofDays(1));
        } catch (TimeoutException keepWaiting) {
          // a day without a change: wait on
        }
      }
    }

    /** The next leadership within {@code wait}; {@link TimeoutException} when none came. */
    public Optional<Leadership> changed(Duration wait) throws IOException, InterruptedException, TimeoutException {
      long deadline = System.nanoTime() + wait.toNanos();
      while (true) {
        Optional<Leadership> now = read(client, name);
        if (first || !now.equals(last)) {
          first = false;
          last = now;
          return now;
        }
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          throw new TimeoutException("no change of leadership within " + wait);
        }
        wake.tryAcquire(Math.min(TimeUnit.NANOSECONDS.toMillis(left) + 1, POLL_MS), TimeUnit.MILLISECONDS);
        wake.drainPermits();
      }
    }

    @Override
    public void close() throws InterruptedIOException {
      events.close();
      listener.interrupt();
      try {
        listener.join();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new InterruptedIOException("interrupted while closing the observer");
      }
    }

    private void listen() {
      try {
        while (true) {
          events.next();
          wake.release();
        }
      } catch (IOException | InterruptedException ended) {
        // closed, or refused: the 500 ms reads go on alone
      }
    }

    static Optional<Leadership> read(PalisadeClient client, String name) throws IOException, InterruptedException {
      LockStatus status = client.status(name);
      if (status.holder() == null) {
        return Optional.empty();
      }
      return Optional.of(new Leadership(status.holder(), status.epoch(), status.value()));
    }
  }
}

// The background renewal both guards share: a daemon thread following a Schedule, and the loss as a future.
package dev.palisade.client;

import java.io.IOException;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Renews something with a TTL (a lease, a session) on a daemon thread, following its {@link
 * Schedule}, until {@link #stop}, or until a renewal is refused (a {@link PalisadeException}:
 * final) or none has succeeded before the renewal deadline (a {@link
 * PalisadeException.LeaseLost} whose cause is the last failure): then {@link #lost}
 * completes with why.
 */
final class Renewal {
  /** One renewal, bounded by {@code timeout}; answers the TTL granted, in milliseconds. */
  interface Renew {
    long renew(Duration timeout) throws IOException, InterruptedException;
  }

  private final CompletableFuture<IOException> lost = new CompletableFuture<>();
  private final CountDownLatch stop = new CountDownLatch(1);
  private final Thread thread;

  private final String name;
  private final Schedule schedule; // guarded by this

  /** Starts renewing what a request sent at {@code sentAt} (nanoTime) was granted. */
  Renewal(String name, long ttlMs, long sentAt, Deadlines deadlines, Renew renew) {
    this.name = name;
    this.schedule = new Schedule(ttlMs, sentAt, deadlines);
    thread = new Thread(() -> run(renew), name);
    thread.setDaemon(true);
    thread.start();
  }

  /** What ends the renewed thing (a release, a session's close). */
  interface End {
    void run() throws IOException, InterruptedException;
  }

  /** A copy of the loss future: callers cannot complete the guard's own. */
  CompletableFuture<IOException> lost() {
    return lost.copy();
  }

  boolean isLost() {
    return lost.isDone() || givenUp(System.nanoTime());
  }

  synchronized long safeUntil() {
    return schedule.safeUntil();
  }

  synchronized long renewDeadline() {
    return schedule.renewBy();
  }

  private synchronized boolean givenUp(long now) {
    return schedule.givenUp(now);
  }

  /**
   * Stops renewing (waiting at most one renewal's timeout), then throws why it was lost,
   * or runs {@code end}. An interrupt is an {@link java.io.InterruptedIOException} with the
   * thread's interrupt status kept: {@code end}'s outcome is then unknown, and the thing
   * ends at its TTL at the latest.
   */
  void finish(String what, End end) throws IOException {
    stop.countDown();
    try {
      thread.join();
      if (lost.isDone()) {
        throw lost.join();
      }
      synchronized (this) {
        schedule.ended(System.nanoTime()); // from here on it is being ended
      }
      end.run();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new java.io.InterruptedIOException("interrupted while ending " + what);
    }
  }

  private void run(Renew renew) {
    IOException lastFailure = null;
    try {
      while (true) {
        long wait;
        synchronized (this) {
          wait = schedule.due() - System.nanoTime();
        }
        if (stop.await(Math.max(0, wait), TimeUnit.NANOSECONDS)) {
          return;
        }
        long sentAt = System.nanoTime();
        Duration timeout;
        synchronized (this) {
          if (schedule.givenUp(sentAt)) {
            lost.complete(PalisadeException.LeaseLost.presumed(name, lastFailure));
            return;
          }
          timeout = Duration.ofNanos(schedule.timeoutNanos(sentAt));
        }
        try {
          long granted = renew.renew(timeout);
          synchronized (this) {
            schedule.renewed(sentAt, granted);
          }
        } catch (PalisadeException refused) {
          synchronized (this) {
            schedule.ended(sentAt); // over at the server, since before this answer
          }
          lost.complete(refused); // a refusal is final
          return;
        } catch (IOException failed) {
          // Possibly alive still: retried until the renewal deadline.
          lastFailure = failed;
          synchronized (this) {
            schedule.failed(System.nanoTime());
          }
        }
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}

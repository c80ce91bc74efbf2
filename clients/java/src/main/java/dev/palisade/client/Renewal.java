// The background renewal both guards share: a daemon thread, and the loss as a future.
package dev.palisade.client;

import java.io.IOException;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Renews something with a TTL (a lease, a session) on a daemon thread every third of the
 * TTL until {@link #stop}, or until a renewal is refused (a {@link PalisadeException}: final)
 * or has failed for a whole TTL counted from the sending of the last renewal that worked (a
 * {@link PalisadeException.LeaseLost} whose cause is the last failure): then {@link #lost}
 * completes with why.
 */
final class Renewal {
  /** One renewal, bounded by {@code timeout}. */
  interface Renew {
    void renew(Duration timeout) throws IOException, InterruptedException;
  }

  private final CompletableFuture<IOException> lost = new CompletableFuture<>();
  private final CountDownLatch stop = new CountDownLatch(1);
  private final Thread thread;

  private final String name;

  Renewal(String name, long ttlMs, Renew renew) {
    this.name = name;
    thread = new Thread(() -> run(ttlMs, renew), name);
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
    return lost.isDone();
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
      end.run();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new java.io.InterruptedIOException("interrupted while ending " + what);
    }
  }

  private void run(long ttlMs, Renew renew) {
    Duration every = Duration.ofMillis(Math.max(1, ttlMs / 3));
    long renewedAt = System.nanoTime();
    try {
      while (!stop.await(every.toMillis(), TimeUnit.MILLISECONDS)) {
        long sentAt = System.nanoTime();
        try {
          renew.renew(every);
          renewedAt = sentAt; // the TTL runs from a moment after the sending
        } catch (PalisadeException refused) {
          lost.complete(refused); // a refusal is final
          return;
        } catch (IOException failed) {
          // A failed request is retried until the TTL is spent.
          if (System.nanoTime() - renewedAt >= TimeUnit.MILLISECONDS.toNanos(ttlMs)) {
            lost.complete(PalisadeException.LeaseLost.presumed(name, failed));
            return;
          }
        }
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}

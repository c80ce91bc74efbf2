// The event stream (typed events, reconnection with reset) and leader election, against a
// real server.
package dev.palisade.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

class EventsAndElectionTest extends ServerTest {
  private static final Duration TTL = Duration.ofSeconds(10);

  /** The first event of type {@code type} within 10 s, skipping others. */
  private static <T extends LockEvent> T await(EventStream events, Class<T> type) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (System.nanoTime() < deadline) {
      LockEvent event = events.poll(Duration.ofMillis(100));
      if (type.isInstance(event)) {
        return type.cast(event);
      }
    }
    throw new AssertionError("no " + type.getSimpleName() + " event within 10 s");
  }

  /**
   * A grant, a release, a mark advancing and a refused late write arrive as typed events, in
   * order, with their fields.
   */
  @Test
  void eventsArriveTypedAndInOrder() throws Exception {
    try (EventStream events = client.lockEvents("orders")) {
      // The stream is live once it shows a grant made after it was opened: until then,
      // grant, read everything the stream has, and let go again.
      Lease first;
      LockEvent.Granted granted = null;
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
      do {
        assertTrue(System.nanoTime() < deadline, "the stream never showed a grant");
        first = client.acquire("orders", AcquireOptions.ttl(TTL).holder("a"));
        for (LockEvent e = events.poll(Duration.ofMillis(300)); e != null && granted == null; e = events.poll(Duration.ofMillis(300))) {
          if (e instanceof LockEvent.Granted g && g.epoch() == first.epoch()) {
            granted = g;
          }
        }
        if (granted == null) {
          client.release(first.leaseId());
        }
      } while (granted == null);
      assertEquals(new LockEvent.Granted(granted.id(), granted.atMs(), "orders", first.epoch(), "a", TTL.toMillis()), granted);
      client.put("orders", "k", bytes("v"), first.token());
      LockEvent.MarkAdvanced advanced = await(events, LockEvent.MarkAdvanced.class);
      assertEquals(first.epoch(), advanced.highWater());
      client.release(first.leaseId());
      LockEvent.Released released = await(events, LockEvent.Released.class);
      assertEquals(first.epoch(), released.epoch());
      assertEquals("release", released.cause());
      assertTrue(released.id() > granted.id());
      Lease second = client.acquire("orders", AcquireOptions.ttl(TTL).holder("b"));
      client.put("orders", "k", bytes("b"), second.token());
      Lease stale = first;
      assertThrows(PalisadeException.StaleToken.class, () -> client.put("orders", "k", bytes("late"), stale.token()));
      LockEvent.Rejected rejected = await(events, LockEvent.Rejected.class);
      assertEquals(new LockEvent.Rejected(rejected.id(), rejected.atMs(), "orders", "stale_token", first.epoch(), second.epoch()), rejected);
    }
  }

  /**
   * When the server restarts under a stream (of every lock named jobs...), the stream reconnects by itself with the last
   * id it delivered; the new run does not know that id, so a reset comes first, then live
   * events again.
   */
  @Test
  void aStreamReconnectsAfterARestartWithAReset() throws Exception {
    try (EventStream events = client.events("jobs")) {
      Lease lease;
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
      do {
        assertTrue(System.nanoTime() < deadline, "the stream never showed an event");
        lease = client.acquire("jobs", AcquireOptions.ttl(TTL).holder("a"));
        client.release(lease.leaseId());
      } while (events.poll(Duration.ofMillis(300)) == null);
      server.restart();
      LockEvent.Reset reset = await(events, LockEvent.Reset.class);
      assertEquals("unknown_last_event_id", reset.reason());
      assertNotNull(events.lastError());
      // "jobs" itself waits out its reservation after the crash: another lock of the prefix.
      Lease after = client.acquire("jobs-2", AcquireOptions.ttl(TTL).holder("b"));
      LockEvent.Granted granted = await(events, LockEvent.Granted.class);
      assertEquals(after.epoch(), granted.epoch());
    }
  }

  /** A refusal that retrying cannot change ends the stream with it. */
  @Test
  void aStreamOfAnUnsendablePrefixIsRefused() throws Exception {
    try (EventStream events = client.events("no spaces allowed")) {
      PalisadeException refused = assertThrows(PalisadeException.class, () -> events.poll(Duration.ofSeconds(10)));
      assertEquals("bad_request", refused.code());
    }
  }

  /**
   * Two candidates: the first leads, the second waits in line; an observer sees the
   * leader, its new value, and the second leader after the first resigns; the new leader's
   * barrier shuts the old one out.
   */
  @Test
  void anElectionHandsLeadershipOnAndFencesTheFormerLeader() throws Exception {
    Election election = new Election(client, "primary", TTL);
    try (Election.Observer observer = election.observe()) {
      assertEquals(Optional.empty(), observer.changed(Duration.ofSeconds(10)));
      Election.Leader a = election.campaign("replica-a", bytes("10.0.0.1"));
      assertEquals(Optional.of(new Leadership("replica-a", a.term(), bytes("10.0.0.1"))), observer.changed(Duration.ofSeconds(10)));
      CompletableFuture<Election.Leader> b =
          CompletableFuture.supplyAsync(
              () -> {
                try {
                  return election.campaign("replica-b", bytes("10.0.0.2"));
                } catch (Exception e) {
                  throw new IllegalStateException(e);
                }
              });
      // b is in line once the lock shows a waiter.
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (client.status("primary").waiters() == 0) {
        assertTrue(System.nanoTime() < deadline, "the second candidate never queued");
        Thread.sleep(20);
      }
      a.proclaim(bytes("10.0.0.9"));
      Leadership moved = observer.changed(Duration.ofSeconds(10)).orElseThrow();
      assertArrayEquals(bytes("10.0.0.9"), moved.value());
      assertEquals(a.term(), moved.term());
      client.put("primary", "state", bytes("from a"), a.token());
      a.resign();
      Election.Leader leaderB = b.get(10, TimeUnit.SECONDS);
      assertTrue(leaderB.term() > a.term());
      Leadership next = observer.changed(Duration.ofSeconds(10)).orElseThrow();
      assertEquals("replica-b", next.leader());
      assertEquals(leaderB.term(), next.term());
      assertEquals(leaderB.term(), leaderB.fence().highWater());
      assertThrows(PalisadeException.StaleToken.class, () -> client.put("primary", "state", bytes("late"), a.token()));
      assertFalse(leaderB.lost().isDone());
      leaderB.resign();
      assertEquals(Optional.empty(), observer.changed(Duration.ofSeconds(10)));
    }
  }
}

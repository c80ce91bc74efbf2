// The rest of the surface against a real server: the fenced store's options, the barrier,
// token checks, lock values and status, sessions.
package dev.palisade.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.Test;

class RecipesTest extends ServerTest {
  private static final Duration TTL = Duration.ofSeconds(10);

  @Override
  String[] serverArgs() {
    return new String[] {"--policy", "seq-*=sequence"};
  }

  private Lease take(String lock, String holder) throws Exception {
    return client.acquire(lock, AcquireOptions.ttl(TTL).holder(holder));
  }

  /** If-None-Match, If-Match, Idempotency-Key, delete and list, on one namespace. */
  @Test
  void preconditionsIdempotencyDeleteAndList() throws Exception {
    String t = take("kv", "a").token();
    Written first = client.put("kv", "k", bytes("1"), t, PutOptions.none().ifAbsent());
    PalisadeException.RevisionMismatch exists =
        assertThrows(PalisadeException.RevisionMismatch.class, () -> client.put("kv", "k", bytes("2"), t, PutOptions.none().ifAbsent()));
    assertEquals(first.revision(), exists.currentRevision());
    assertThrows(
        PalisadeException.RevisionMismatch.class,
        () -> client.put("kv", "k", bytes("2"), t, PutOptions.none().ifMatch(first.revision() + 1)));
    Written second = client.put("kv", "k", bytes("2"), t, PutOptions.none().ifMatch(first.revision()));
    // A retry with the same key answers the first outcome and applies nothing twice.
    PutOptions once = PutOptions.none().idempotencyKey("op-1");
    Written applied = client.put("kv", "other", bytes("x"), t, once);
    assertEquals(applied, client.put("kv", "other", bytes("x"), t, once));
    PalisadeException reused = assertThrows(PalisadeException.class, () -> client.put("kv", "other", bytes("y"), t, once));
    assertEquals("idempotency_conflict", reused.code());
    assertArrayEquals(bytes("x"), client.get("kv", "other").value());
    client.put("kv", "dir/a", bytes("a"), t);
    client.put("kv", "dir/b", bytes("b"), t);
    assertEquals(List.of("dir/a", "dir/b"), client.list("kv", "dir/", 10));
    assertEquals(List.of("dir/a"), client.list("kv", "dir/", 1));
    Written deleted = client.delete("kv", "k", t, PutOptions.none().ifMatch(second.revision()));
    assertTrue(deleted.revision() > second.revision());
    assertThrows(PalisadeException.NotFound.class, () -> client.get("kv", "k"));
    assertThrows(PalisadeException.NotFound.class, () -> client.delete("kv", "k", t, PutOptions.none()));
  }

  /** In a sequence namespace, (epoch, seq) must strictly increase. */
  @Test
  void theSequencePolicy() throws Exception {
    Lease lease = take("seq-jobs", "a");
    client.put("seq-jobs", "k", bytes("1"), lease.token(), PutOptions.none().seq(1));
    client.put("seq-jobs", "k", bytes("5"), lease.token(), PutOptions.none().seq(5));
    PalisadeException.StaleSequence replay =
        assertThrows(
            PalisadeException.StaleSequence.class,
            () -> client.put("seq-jobs", "k", bytes("late"), lease.token(), PutOptions.none().seq(4)));
    assertEquals(5, replay.highWaterSeq());
    assertEquals(4, replay.seq());
    FenceStatus status = client.fenceStatus("seq-jobs");
    assertEquals(new FenceStatus("seq-jobs", lease.epoch(), 5, "sequence"), status);
  }

  /**
   * The barrier: a new holder's fence shuts the old one out before either writes; the
   * token check tells a current token from a stale one, and a forgery from both.
   */
  @Test
  void theBarrierAndTheTokenCheck() throws Exception {
    Lease old = take("orders", "a");
    TokenCheck live = client.checkToken(old.token());
    assertTrue(live.genuine() && live.current() && live.leaseAlive(), live.toString());
    assertEquals("a", live.holder());
    client.release(old.leaseId());
    Lease next = take("orders", "b");
    Fenced fenced = client.fence("orders", next.token(), PutOptions.none());
    assertEquals(new Fenced("orders", next.epoch(), next.epoch()), fenced);
    PalisadeException.StaleToken stale =
        assertThrows(PalisadeException.StaleToken.class, () -> client.put("orders", "k", bytes("late"), old.token()));
    assertEquals(next.epoch(), stale.highWater());
    TokenCheck gone = client.checkToken(old.token());
    assertTrue(gone.genuine());
    assertFalse(gone.current() || gone.leaseAlive(), gone.toString());
    assertEquals(next.epoch(), gone.currentEpoch());
    TokenCheck forged = client.checkToken("pal1.not.genuine");
    assertFalse(forged.genuine());
    assertTrue(forged.reason() != null && !forged.reason().isEmpty());
  }

  /** A value given at acquisition is shown in the lock's status; proclaim replaces it. */
  @Test
  void lockValuesAndStatus() throws Exception {
    Lease lease = client.acquire("leader", AcquireOptions.ttl(TTL).holder("node-1").value(bytes("10.0.0.1:80")));
    LockStatus status = client.status("leader");
    assertEquals("node-1", status.holder());
    assertEquals(lease.epoch(), status.epoch());
    assertArrayEquals(bytes("10.0.0.1:80"), status.value());
    assertEquals(0, status.waiters());
    client.proclaim(lease.leaseId(), bytes("10.0.0.2:80"));
    assertArrayEquals(bytes("10.0.0.2:80"), client.status("leader").value());
    client.proclaim(lease.leaseId(), null);
    assertNull(client.status("leader").value());
    client.release(lease.leaseId());
    LockStatus free = client.status("leader");
    assertNull(free.holder());
    assertEquals(lease.epoch(), free.epoch());
  }

  /**
   * A session guard keeps two leases alive past four TTLs with its keepalives alone, and
   * closing it releases both.
   */
  @Test
  void aSessionHoldsManyLocksAndReleasesThemOnClose() throws Exception {
    Duration ttl = Duration.ofMillis(600);
    Lease a;
    Lease b;
    try (SessionGuard session = client.holdSession("worker", ttl)) {
      a = client.acquire("s-a", AcquireOptions.inSession(session.id()).holder("worker"));
      b = client.acquire("s-b", AcquireOptions.inSession(session.id()).holder("worker"));
      long deadline = System.nanoTime() + ttl.multipliedBy(4).toNanos();
      while (System.nanoTime() < deadline) {
        assertEquals(a.epoch(), client.status("s-a").epoch());
        assertEquals("worker", client.status("s-b").holder());
        Thread.sleep(ttl.toMillis() / 4);
      }
      assertFalse(session.isLost());
      Session now = client.getSession(session.id());
      assertEquals(2, now.leases().size());
      assertEquals(session.id(), client.status("s-a").session());
    }
    assertNull(client.status("s-a").holder());
    assertNull(client.status("s-b").holder());
    assertTrue(a.epoch() > 0 && b.epoch() > 0);
  }

  /** A session closed by someone else is noticed by its guard. */
  @Test
  void aSessionGuardSaysWhenItsSessionIsLost() throws Exception {
    SessionGuard session = client.holdSession("worker", Duration.ofMillis(600));
    client.closeSession(session.id());
    java.io.IOException why = session.lost().get(10, java.util.concurrent.TimeUnit.SECONDS);
    assertTrue(why instanceof PalisadeException p && p.code().equals("session_expired"), String.valueOf(why));
    assertThrows(PalisadeException.class, session::close);
  }
}

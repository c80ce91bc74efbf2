// The client against a real `palisade serve`: fencing, a held lock, the guard, the keys.
package dev.palisade.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.palisade.token.Claims;
import dev.palisade.token.TokenException;
import dev.palisade.token.Verifier;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

class ClientTest extends ServerTest {
  private static AcquireOptions as(String holder, Duration ttl) {
    return AcquireOptions.ttl(ttl).holder(holder);
  }

  /**
   * The fencing story: a holder writes, loses the lock, and its late write is refused with
   * both epochs; the lock held is refused with its holder; the stored value is the newer
   * holder's.
   */
  @Test
  void aLateWriteIsFencedOff() throws Exception {
    Duration ttl = Duration.ofSeconds(10);
    Lease first = client.acquire("orders", as("a", ttl));
    client.put("orders", "k", "from a".getBytes(StandardCharsets.UTF_8), first.token());
    PalisadeException.LockHeld held =
        assertThrows(PalisadeException.LockHeld.class, () -> client.acquire("orders", as("b", ttl)));
    assertEquals("a", held.holder());
    client.release(first.leaseId());
    Lease second = client.acquire("orders", as("b", ttl));
    assertTrue(Long.compareUnsigned(second.epoch(), first.epoch()) > 0);
    Written written = client.put("orders", "k", "from b".getBytes(StandardCharsets.UTF_8), second.token());
    assertEquals(second.epoch(), written.epoch());
    PalisadeException.StaleToken stale =
        assertThrows(
            PalisadeException.StaleToken.class,
            () -> client.put("orders", "k", "late, from a".getBytes(StandardCharsets.UTF_8), first.token()));
    assertEquals(first.epoch(), stale.epoch());
    assertEquals(second.epoch(), stale.highWater());
    assertTrue(stale.isFenced());
    Entry entry = client.get("orders", "k");
    assertArrayEquals("from b".getBytes(StandardCharsets.UTF_8), entry.value());
    assertEquals(second.epoch(), entry.epoch());
    assertEquals(written.revision(), entry.revision());
    assertThrows(PalisadeException.NotFound.class, () -> client.get("orders", "absent"));
    client.put("orders", "dir/file name", "v".getBytes(StandardCharsets.UTF_8), second.token());
    assertArrayEquals("v".getBytes(StandardCharsets.UTF_8), client.get("orders", "dir/file name").value());
  }

  /** The server's tokens verify offline with the keys it lists, and only for their lock. */
  @Test
  void tokensVerifyOfflineWithTheListedKeys() throws Exception {
    Lease lease = client.acquire("billing", as("w", Duration.ofSeconds(10)));
    Verifier verifier = new Verifier(client.keys(), 16);
    Claims claims = verifier.verifyFor(lease.token(), "billing");
    assertEquals(new Claims("billing", lease.epoch(), "w", claims.keyId()), claims);
    assertThrows(TokenException.WrongLock.class, () -> verifier.verifyFor(lease.token(), "orders"));
  }

  /** A guard keeps its lease past four TTLs by renewing it, and releases it on close. */
  @Test
  void aGuardRenewsUntilClosed() throws Exception {
    Duration ttl = Duration.ofMillis(600);
    try (LeaseGuard guard = client.hold("jobs", as("a", ttl))) {
      long deadline = System.nanoTime() + ttl.multipliedBy(4).toNanos();
      while (System.nanoTime() < deadline) {
        assertThrows(PalisadeException.LockHeld.class, () -> client.acquire("jobs", as("b", ttl)));
        Thread.sleep(ttl.toMillis() / 4);
      }
      assertFalse(guard.isLost());
    }
    assertEquals("b", client.acquire("jobs", as("b", ttl)).holder());
  }

  /** A guard whose lease was taken away (released by someone else here) says so. */
  @Test
  void aGuardSaysWhenItsLeaseIsLost() throws Exception {
    LeaseGuard guard = client.hold("jobs", as("a", Duration.ofMillis(600)));
    client.release(guard.lease().leaseId());
    IOException why = guard.lost().get(10, TimeUnit.SECONDS);
    assertTrue(why instanceof PalisadeException.LeaseLost p && p.code().equals("lease_expired"), String.valueOf(why));
    assertTrue(guard.isLost());
    assertEquals(Duration.ZERO, guard.safeFor()); // over at the server: no time left to act
    assertThrows(PalisadeException.class, guard::close);
  }

  /** With its server gone, a guard gives its lease up at the renewal deadline, before the safe one. */
  @Test
  void aGuardWithoutRenewalsGivesItsLeaseUpAtTheRenewalDeadline() throws Exception {
    int port;
    try (java.net.ServerSocket free = new java.net.ServerSocket(0)) {
      port = free.getLocalPort(); // nothing listens there once it is closed: renewals fail
    }
    PalisadeClient nowhere = PalisadeClient.builder("http://127.0.0.1:" + port).build();
    long sent = System.nanoTime();
    Lease lease = client.acquire("alone", as("a", Duration.ofMillis(600)));
    LeaseGuard guard = new LeaseGuard(nowhere, lease, sent);
    assertEquals(400 * 1_000_000L, guard.renewDeadlineNanos() - sent, 1_000);
    assertEquals(594 * 1_000_000L, guard.safeUntilNanos() - sent, 1_000);
    IOException why = guard.lost().get(10, TimeUnit.SECONDS);
    assertTrue(why.getMessage().contains("renewal deadline"), why.getMessage());
    assertTrue(guard.isLost());
  }
}

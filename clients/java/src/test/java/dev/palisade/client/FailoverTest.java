// Failover between endpoints, and TLS with the deployment's own CA, against real servers.
package dev.palisade.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import dev.palisade.client.Transport.Failure;
import dev.palisade.client.Transport.Retry;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class FailoverTest {
  @TempDir Path dir;

  /** The rule, whole: unreachable always moves on; 503 unless only-unreachable; a lost answer only when safe. */
  @Test
  void whichFailuresMoveACallOn() {
    for (Retry retry : Retry.values()) {
      assertTrue(Transport.mayTryNext(retry, Failure.UNREACHABLE));
    }
    assertTrue(Transport.mayTryNext(Retry.SAFE, Failure.UNAVAILABLE));
    assertTrue(Transport.mayTryNext(Retry.UNLESS_UNKNOWN, Failure.UNAVAILABLE));
    assertFalse(Transport.mayTryNext(Retry.ONLY_UNREACHABLE, Failure.UNAVAILABLE));
    assertTrue(Transport.mayTryNext(Retry.SAFE, Failure.UNKNOWN));
    assertFalse(Transport.mayTryNext(Retry.UNLESS_UNKNOWN, Failure.UNKNOWN));
    assertFalse(Transport.mayTryNext(Retry.ONLY_UNREACHABLE, Failure.UNKNOWN));
  }

  /** A first endpoint nobody listens on is skipped for every call. */
  @Test
  void anUnreachableNodeIsSkipped() throws Exception {
    TestServer server = new TestServer(dir);
    try {
      int closed;
      try (ServerSocket s = new ServerSocket(0)) {
        closed = s.getLocalPort();
      }
      PalisadeClient client =
          PalisadeClient.builder("http://127.0.0.1:" + closed).endpoint(server.url()).timeout(Duration.ofSeconds(5)).build();
      Lease lease = client.acquire("orders", AcquireOptions.ttl(Duration.ofSeconds(10)).holder("a"));
      client.put("orders", "k", "v".getBytes(StandardCharsets.UTF_8), lease.token());
      assertArrayEquals("v".getBytes(StandardCharsets.UTF_8), client.get("orders", "k").value());
      client.release(lease.leaseId());
    } finally {
      server.stop();
    }
  }

  /**
   * A node answering 503 passes an acquire and a write on to the next node, the write with
   * an idempotency key of its own; a node that drops the connection after reading an
   * acquire does not: a second acquire could be a second lease.
   */
  @Test
  void aLostAnswerIsResentOnlyWhenItIsSafe() throws Exception {
    TestServer server = new TestServer(dir);
    List<String> seen = new CopyOnWriteArrayList<>();
    HttpServer unavailable = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
    unavailable.createContext("/", exchange -> {
      seen.add(exchange.getRequestMethod() + " " + exchange.getRequestURI().getPath() + " key="
          + exchange.getRequestHeaders().getFirst("Idempotency-Key"));
      byte[] body = "{\"error\":{\"code\":\"unavailable\",\"message\":\"down\"}}".getBytes(StandardCharsets.UTF_8);
      exchange.sendResponseHeaders(503, body.length);
      exchange.getResponseBody().write(body);
      exchange.close();
    });
    HttpServer dropping = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
    dropping.createContext("/", exchange -> {
      exchange.getRequestBody().readAllBytes();
      exchange.close(); // no answer: the request may have been applied
    });
    unavailable.start();
    dropping.start();
    try {
      String down = "http://127.0.0.1:" + unavailable.getAddress().getPort();
      PalisadeClient client = PalisadeClient.builder(down).endpoint(server.url()).build();
      Lease lease = client.acquire("orders", AcquireOptions.ttl(Duration.ofSeconds(10)).holder("a"));
      // A new client starts at the first node again (a client remembers the node that answered).
      PalisadeClient writer = PalisadeClient.builder(down).endpoint(server.url()).build();
      writer.put("orders", "k", "v".getBytes(StandardCharsets.UTF_8), lease.token());
      assertArrayEquals("v".getBytes(StandardCharsets.UTF_8), client.get("orders", "k").value());
      assertEquals(2, seen.size(), seen.toString());
      assertTrue(seen.get(0).startsWith("POST /v1/locks/orders/acquire key=null"), seen.get(0));
      assertTrue(seen.get(1).startsWith("PUT /v1/kv/orders/k key=") && !seen.get(1).endsWith("key=null"), seen.get(1));
      client.release(lease.leaseId());

      PalisadeClient risky =
          PalisadeClient.builder("http://127.0.0.1:" + dropping.getAddress().getPort()).endpoint(server.url()).build();
      assertThrows(IOException.class, () -> risky.acquire("jobs", AcquireOptions.ttl(Duration.ofSeconds(10)).holder("b")));
      assertNull(server.client().status("jobs").holder(), "the acquire was resent to the next node");
      // A read is safe to resend: it goes on.
      assertEquals("orders", risky.status("orders").lock());
    } finally {
      unavailable.stop(0);
      dropping.stop(0);
      server.stop();
    }
  }

  /** A server with a certificate of the deployment's own CA: trusted through caCertificate only. */
  @Test
  void tlsWithTheDeploymentsOwnCa() throws Exception {
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem");
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr");
    Files.writeString(dir.resolve("ext.cnf"), "subjectAltName=IP:127.0.0.1\n");
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "ext.cnf", "-out", "server.pem");
    TestServer server =
        new TestServer(dir, "--tls-cert", dir.resolve("server.pem").toString(), "--tls-key", dir.resolve("server.key").toString());
    try {
      assertTrue(server.url().startsWith("https://"), server.url());
      PalisadeClient trusting = PalisadeClient.builder(server.url()).caCertificate(dir.resolve("ca.pem")).build();
      Lease lease = trusting.acquire("orders", AcquireOptions.ttl(Duration.ofSeconds(10)).holder("a"));
      assertEquals("a", trusting.status("orders").holder());
      trusting.release(lease.leaseId());
      PalisadeClient stranger = PalisadeClient.builder(server.url()).build();
      IOException refused = assertThrows(IOException.class, () -> stranger.status("orders"));
      assertFalse(refused instanceof PalisadeException, refused.toString());
    } finally {
      server.stop();
    }
  }

  private void openssl(String... args) throws Exception {
    List<String> command = new java.util.ArrayList<>(List.of("openssl"));
    command.addAll(List.of(args));
    Process p = new ProcessBuilder(command).directory(dir.toFile()).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertEquals(0, p.waitFor(), "openssl " + args[0] + ": " + out);
  }
}

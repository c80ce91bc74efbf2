// The base of the test classes that run against a real `palisade serve`: a fresh server per
// test, in the test's own temp dir, and a client of it; stopped by its pid after the test.
package dev.palisade.client;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.io.TempDir;

abstract class ServerTest {
  @TempDir Path dir;
  TestServer server;
  PalisadeClient client;

  /** Extra `palisade serve` arguments for this class's servers (none by default). */
  String[] serverArgs() {
    return new String[0];
  }

  @BeforeEach
  void start() throws Exception {
    server = new TestServer(dir, serverArgs());
    client = server.client();
  }

  @AfterEach
  void stop() throws InterruptedException {
    server.stop();
  }

  static byte[] bytes(String text) {
    return text.getBytes(StandardCharsets.UTF_8);
  }
}

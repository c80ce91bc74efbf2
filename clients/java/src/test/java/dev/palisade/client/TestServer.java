// A real `palisade serve` for the client's tests, stopped by its pid.
package dev.palisade.client;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * Starts `palisade serve` (PALISADE_BIN, or the workspace's debug build) on a free loopback
 * port with its data in {@code dir}, reading its URL from its start-up line; {@link #stop}
 * kills it by its pid.
 */
final class TestServer {
  private final Path dir;
  private final String[] extra;
  private Process process;
  private String url;

  TestServer(Path dir, String... extra) throws IOException {
    this.dir = dir;
    this.extra = extra;
    start("127.0.0.1:0");
  }

  /** Kills the server and starts it again on the same address and data directory. */
  void restart() throws IOException, InterruptedException {
    stop();
    start(url.replaceFirst("^https?://", ""));
  }

  private void start(String listen) throws IOException {
    String bin = System.getenv("PALISADE_BIN");
    Path path = Path.of(bin != null ? bin : "../../target/debug/palisade");
    assertTrue(Files.isExecutable(path), "no palisade binary at " + path + " (build it, or set PALISADE_BIN)");
    List<String> command =
        new ArrayList<>(List.of(path.toString(), "serve", "--listen", listen, "--data-dir", dir.resolve("data").toString()));
    command.addAll(List.of(extra));
    process = new ProcessBuilder(command).redirectError(ProcessBuilder.Redirect.DISCARD).start();
    BufferedReader out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
    String line = out.readLine();
    String prefix = "palisade listening on ";
    assertTrue(line != null && line.startsWith(prefix), "no start-up line: " + line);
    url = line.substring(prefix.length()).split(",")[0].trim();
  }

  String url() {
    return url;
  }

  PalisadeClient client() {
    return PalisadeClient.builder(url).build();
  }

  void stop() throws InterruptedException {
    process.destroyForcibly();
    process.waitFor(10, TimeUnit.SECONDS);
  }
}

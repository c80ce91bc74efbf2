// A throwaway PostgreSQL cluster for the gate's tests, stopped by its pid.
package dev.palisade.gate;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * initdb in a temp dir, the server on a free loopback port with fsync on, stopped by its
 * pid (SIGINT, PostgreSQL's fast shutdown) on {@link #stop}. PostgreSQL refuses to run as
 * root, so as root both run as nobody through setpriv (which execs: the pid is the
 * server's own).
 */
final class TestPostgres {
  private final Path dir;
  private final Process server;
  private final int port;

  TestPostgres() throws IOException, InterruptedException {
    Path bin = bin();
    dir = Files.createTempDirectory(Path.of("/tmp"), "palisade-pg-");
    boolean root = "root".equals(System.getProperty("user.name"));
    if (root) {
      run(List.of("chown", "nobody:nogroup", dir.toString()), false);
    }
    Path data = dir.resolve("data");
    run(as(root, bin.resolve("initdb").toString(), "-D", data.toString(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"), true);
    try (ServerSocket free = new ServerSocket(0)) {
      port = free.getLocalPort();
    }
    server =
        new ProcessBuilder(
                as(root, bin.resolve("postgres").toString(), "-D", data.toString(), "-p", String.valueOf(port), "-h", "127.0.0.1",
                    "-c", "unix_socket_directories=", "-c", "max_connections=100"))
            .directory(dir.toFile())
            .redirectErrorStream(true)
            .redirectOutput(dir.resolve("server.log").toFile())
            .start();
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
    while (System.nanoTime() < deadline) {
      if (!server.isAlive()) {
        throw new IllegalStateException("postgres exited:\n" + Files.readString(dir.resolve("server.log")));
      }
      try (Connection ready = connect()) {
        if (ready.isValid(5)) {
          return;
        }
      } catch (SQLException notYet) {
        // not accepting connections yet
      }
      Thread.sleep(50);
    }
    stop();
    throw new IllegalStateException("postgres not ready within 60 s");
  }

  /** A JDBC URL of database {@code db}. */
  String url(String db) {
    return "jdbc:postgresql://127.0.0.1:" + port + "/" + db + "?user=postgres";
  }

  Connection connect() throws SQLException {
    return DriverManager.getConnection(url("postgres"));
  }

  /** A new, empty database; its JDBC URL. */
  String createDatabase(String name) throws SQLException {
    try (Connection c = connect(); java.sql.Statement s = c.createStatement()) {
      s.execute("CREATE DATABASE " + name);
    }
    return url(name);
  }

  void stop() throws InterruptedException, IOException {
    if (server.isAlive()) {
      new ProcessBuilder("kill", "-INT", String.valueOf(server.pid())).start().waitFor();
      if (!server.waitFor(15, TimeUnit.SECONDS)) {
        server.destroyForcibly().waitFor();
      }
    }
    try (Stream<Path> walk = Files.walk(dir)) {
      walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    }
  }

  private static List<String> as(boolean root, String... command) {
    List<String> full = new ArrayList<>();
    if (root) {
      full.addAll(List.of("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"));
    }
    full.addAll(List.of(command));
    return full;
  }

  private void run(List<String> command, boolean inDir) throws IOException, InterruptedException {
    ProcessBuilder b = new ProcessBuilder(command).redirectErrorStream(true);
    b.environment().put("LC_ALL", "C");
    if (inDir) {
      b.directory(dir.toFile());
    }
    Process p = b.start();
    String out = new String(p.getInputStream().readAllBytes());
    if (p.waitFor() != 0) {
      throw new IllegalStateException(command.get(0) + " failed:\n" + out);
    }
  }

  /** initdb and postgres: PALISADE_PG_BIN, or the newest /usr/lib/postgresql/N/bin. */
  private static Path bin() throws IOException {
    String env = System.getenv("PALISADE_PG_BIN");
    if (env != null) {
      return Path.of(env);
    }
    try (Stream<Path> versions = Files.list(Path.of("/usr/lib/postgresql"))) {
      return versions
          .filter(p -> p.getFileName().toString().matches("\\d+") && Files.isExecutable(p.resolve("bin/postgres")))
          .max(Comparator.comparingInt(p -> Integer.parseInt(p.getFileName().toString())))
          .map(p -> p.resolve("bin"))
          .orElseThrow(() -> new IllegalStateException("PostgreSQL server binaries not found: run scripts/adapter-services"));
    } catch (java.nio.file.NoSuchFileException e) {
      throw new IllegalStateException("PostgreSQL server binaries not found: run scripts/adapter-services", e);
    }
  }
}

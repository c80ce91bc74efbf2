// The JDBC gate driven from the command line, for the five-language test.
package dev.palisade.gate;

import dev.palisade.client.PalisadeException;
import dev.palisade.token.KeyRing;
import dev.palisade.token.TokenException;
import dev.palisade.token.Verifier;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;

/**
 * The Java gate driven from the command line, for the cross-language test
 * (clients/python/tests/test_five_languages.py): the same arguments and outcome lines as
 * the Rust adapters' {@code fenced_writer} example.
 *
 * <pre>
 * FencedWriter write --db postgres:&lt;jdbc url&gt; --table &lt;name&gt; --public-key &lt;hex&gt;[,&lt;hex&gt;...]
 *                    --lock &lt;lock&gt; --key &lt;key&gt; --value &lt;value&gt; --token &lt;token&gt; [--seq &lt;n&gt;]
 * </pre>
 *
 * <p>One transaction admits the token (retried on {@code write_conflict}) and upserts key =
 * value; the outcome is one line: {@code admitted <epoch> <high_water>} or {@code refused
 * <code> <detail>}. Exit 0 when the line was printed, 2 on a usage or database error.
 */
public final class FencedWriter {
  private FencedWriter() {}

  public static void main(String[] args) {
    try {
      run(args);
    } catch (Exception e) {
      System.err.println("FencedWriter: " + e);
      System.exit(2);
    }
  }

  private static void run(String[] args) throws Exception {
    if (args.length == 0 || !args[0].equals("write") || args.length % 2 != 1) {
      throw new IllegalArgumentException("usage: FencedWriter write --db postgres:<jdbc url> ...");
    }
    Map<String, String> flags = new HashMap<>();
    for (int i = 1; i < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        throw new IllegalArgumentException("unexpected argument " + args[i]);
      }
      flags.put(args[i].substring(2), args[i + 1]);
    }
    for (String name : List.of("db", "table", "public-key", "lock", "key", "value", "token")) {
      if (!flags.containsKey(name)) {
        throw new IllegalArgumentException("missing --" + name);
      }
    }
    List<byte[]> keys = new ArrayList<>();
    for (String key : flags.get("public-key").split(",")) {
      keys.add(HexFormat.of().parseHex(key));
    }
    Verifier verifier = new Verifier(KeyRing.of(keys), 16);
    String db = flags.get("db");
    if (!db.startsWith("postgres:")) {
      throw new IllegalArgumentException("--db must be postgres:<jdbc url>");
    }
    String table = flags.get("table");
    if (!table.matches("[A-Za-z_][A-Za-z0-9_]*")) {
      throw new IllegalArgumentException("--table must be a plain SQL identifier");
    }
    String upsert =
        "INSERT INTO " + table + " (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value";
    try (Connection conn = DriverManager.getConnection(db.substring("postgres:".length()))) {
      conn.setAutoCommit(false);
      while (true) {
        try {
          Admitted admitted = write(conn, verifier, flags, upsert);
          System.out.println("admitted " + admitted.claims().epoch() + " " + admitted.highWater().epoch());
          return;
        } catch (PalisadeException e) {
          conn.rollback();
          if (e.code().equals("write_conflict")) {
            continue; // rolled back: retry the whole transaction
          }
          if (e.code().equals("storage_failed")) {
            throw e;
          }
          System.out.println("refused " + e.code() + " " + detail(e));
          return;
        }
      }
    }
  }

  private static Admitted write(Connection conn, Verifier verifier, Map<String, String> flags, String upsert)
      throws PalisadeException, SQLException {
    Admitted admitted =
        flags.containsKey("seq")
            ? PostgresGate.admitSequenced(conn, verifier, flags.get("token"), flags.get("lock"), Long.parseLong(flags.get("seq")))
            : PostgresGate.admit(conn, verifier, flags.get("token"), flags.get("lock"));
    try (PreparedStatement statement = conn.prepareStatement(upsert)) {
      statement.setString(1, flags.get("key"));
      statement.setString(2, flags.get("value"));
      statement.executeUpdate();
    }
    conn.commit();
    return admitted;
  }

  private static String detail(PalisadeException e) {
    if (e instanceof PalisadeException.StaleToken s) {
      return s.highWater() + ":" + s.epoch();
    }
    if (e instanceof PalisadeException.StaleSequence s) {
      return s.highWater() + ":" + s.highWaterSeq() + ":" + s.epoch() + ":" + s.seq();
    }
    if (e instanceof PalisadeException.WrongLock w) {
      return w.tokenLock();
    }
    if (e.getCause() instanceof TokenException t) {
      return t.refusal();
    }
    return "-";
  }
}

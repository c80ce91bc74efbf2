// The gate inside a PostgreSQL transaction over JDBC, on the shared palisade_fence table.
package dev.palisade.gate;

import dev.palisade.client.PalisadeException;
import dev.palisade.token.Claims;
import dev.palisade.token.Verifier;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Set;

/**
 * The gate inside a PostgreSQL transaction, over plain JDBC (any driver; tested with the
 * PostgreSQL driver), sharing {@code palisade_fence} and its rules with the Rust, Python
 * and Go gates, so that writers in every language can guard one database together.
 *
 * <pre>{@code
 * PostgresGate.migrate(conn);    // at deploy time: checks the settings, creates the table
 * PostgresGate.preflight(conn);  // at every start of the application
 * conn.setAutoCommit(false);
 * try {
 *   PostgresGate.admit(conn, verifier, token, "orders");  // PalisadeException.StaleToken if late
 *   try (PreparedStatement update = conn.prepareStatement("UPDATE orders SET state = 'shipped' WHERE id = ?")) {
 *     update.setLong(1, 42);
 *     update.executeUpdate();
 *   }
 *   conn.commit();
 * } catch (Exception e) {
 *   conn.rollback();
 *   throw e;
 * }
 * }</pre>
 *
 * <p>How it serialises: {@link #admit} locks the lock's row of {@code palisade_fence} with
 * {@code SELECT ... FOR UPDATE} (creating it first with {@code INSERT ... ON CONFLICT DO
 * NOTHING} when the database has never seen the lock). A second transaction admitting for
 * the same lock, in any language, waits on that row lock until the first commits or rolls
 * back, then reads the mark it left. Under {@code REPEATABLE READ} or {@code
 * SERIALIZABLE}, PostgreSQL refuses to lock a row changed after the snapshot was taken:
 * that is {@code write_conflict}; roll back and retry.
 *
 * <p>A refusal poisons the transaction: when {@link #admit} throws it has also raised an
 * error inside PostgreSQL, which marks the transaction aborted, so every later statement
 * fails and {@code COMMIT} becomes a rollback. Writes made before the admit can never
 * commit alongside a refused token, even if the caller swallows the exception. (Rolling
 * back to a savepoint taken before the admit would clear that state: do not.)
 *
 * <p>The connection must be in a transaction ({@code setAutoCommit(false)}): on an
 * autocommit connection each statement would commit on its own, so the gate refuses with
 * {@link IllegalStateException}.
 */
public final class PostgresGate {
  /** The SQL that creates the fence table: crates/adapters/migrations/postgres.sql itself. */
  public static final String MIGRATION = migration();

  private static final String SELECT_MARK = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = ?";
  private static final String LOCK_MARK = SELECT_MARK + " FOR UPDATE";
  private static final String CREATE_MARK =
      "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES (?, 0, 0) ON CONFLICT (lock_name) DO NOTHING";
  private static final String STORE_MARK =
      "UPDATE palisade_fence SET epoch = ?, seq = ?, updated_at = now() WHERE lock_name = ?";
  /** Raising an error is how a refusal is made final: PostgreSQL will not commit after it. */
  private static final String POISON =
      "DO $$ BEGIN RAISE EXCEPTION 'palisade: fenced operation refused; roll back'; END $$";
  /** What {@link UnsafeDatabase#checkPostgres} takes, in its argument order. */
  private static final String SETTINGS =
      "SELECT current_setting('fsync'), current_setting('synchronous_commit'), "
          + "current_setting('full_page_writes'), current_setting('synchronous_standby_names'), "
          + "(SELECT count(*) FROM pg_stat_replication)";
  /** serialization_failure, deadlock_detected, lock_not_available: lost races. */
  private static final Set<String> RETRY = Set.of("40001", "40P01", "55P03");

  private PostgresGate() {}

  /**
   * Checks that the database can keep a mark durable ({@link UnsafeDatabase#checkPostgres}:
   * {@code fsync}, {@code synchronous_commit}, {@code full_page_writes}, and synchronous
   * standbys when streaming replicas are connected): a {@code storage_failed} {@link
   * PalisadeException} whose cause is an {@link UnsafeDatabase} naming every setting that
   * breaks it. Run it when the application starts; {@link #migrate} runs it too.
   */
  public static void preflight(Connection conn) throws PalisadeException {
    UnsafeDatabase unsafe;
    try (Statement statement = conn.createStatement();
        ResultSet row = statement.executeQuery(SETTINGS)) {
      if (!row.next()) {
        throw Gate.storageFailed("PostgreSQL answered no row to the settings query", null);
      }
      unsafe = UnsafeDatabase.checkPostgres(
          row.getString(1), row.getString(2), row.getString(3), row.getString(4), row.getLong(5));
    } catch (SQLException e) {
      throw dbError(e);
    }
    if (unsafe != null) {
      throw Gate.storageFailed(unsafe.getMessage(), unsafe);
    }
  }

  /**
   * Checks the database's settings ({@link #preflight}), then creates the fence table if it
   * does not exist (idempotent), committing it when the connection is not in autocommit
   * mode. Run it once at deploy time.
   */
  public static void migrate(Connection conn) throws PalisadeException {
    preflight(conn);
    migrateUnchecked(conn);
  }

  /**
   * {@link #migrate} without the settings check: for a database whose durability is
   * ensured some other way, and for tests on a throwaway database.
   */
  public static void migrateUnchecked(Connection conn) throws PalisadeException {
    try (Statement statement = conn.createStatement()) {
      statement.execute(MIGRATION);
      if (!conn.getAutoCommit()) {
        conn.commit();
      }
    } catch (SQLException e) {
      throw dbError(e);
    }
  }

  /**
   * Admits {@code token} for {@code lock} inside {@code conn}'s transaction under the
   * epoch policy: an equal or larger epoch passes and raises the mark, a smaller one is
   * refused with {@link PalisadeException.StaleToken}. On success the new mark is part of
   * the transaction and commits or rolls back with the caller's writes; on a refusal the
   * transaction is aborted and must be rolled back.
   */
  public static Admitted admit(Connection conn, Verifier verifier, String token, String lock)
      throws PalisadeException {
    return run(conn, verifier, token, lock, Policy.EPOCH, 0);
  }

  /**
   * {@link #admit} under the sequence policy: (epoch, {@code seq}) must strictly exceed the
   * mark, so a delayed or replayed operation of the current holder is refused too ({@link
   * PalisadeException.StaleSequence}). Use one policy per lock: an epoch-policy admit
   * resets the stored sequence to 0.
   */
  public static Admitted admitSequenced(Connection conn, Verifier verifier, String token, String lock, long seq)
      throws PalisadeException {
    if (seq < 0) {
      throw new IllegalArgumentException("the sequence policy needs a sequence number >= 0, not " + seq);
    }
    return run(conn, verifier, token, lock, Policy.SEQUENCE, seq);
  }

  /**
   * The lock's committed mark as {@code conn} sees it ({@link HighWater#NONE} if never
   * admitted). For inspection only: deciding on it outside the transaction that writes
   * would re-open the check-then-write race (S6).
   */
  public static HighWater highWater(Connection conn, String lock) throws PalisadeException {
    try (PreparedStatement select = conn.prepareStatement(SELECT_MARK)) {
      select.setString(1, lock);
      try (ResultSet row = select.executeQuery()) {
        return row.next() ? Gate.fromSql(row.getLong(1), row.getLong(2)) : HighWater.NONE;
      }
    } catch (SQLException e) {
      throw dbError(e);
    }
  }

  private static Admitted run(Connection conn, Verifier verifier, String token, String lock, Policy policy, long seq)
      throws PalisadeException {
    try {
      if (conn.getAutoCommit()) {
        throw new IllegalStateException(
            "PostgresGate.admit must run inside a transaction (conn.setAutoCommit(false)); "
                + "in autocommit mode each statement would commit on its own");
      }
    } catch (SQLException e) {
      throw dbError(e);
    }
    try {
      return steps(conn, verifier, token, lock, policy, seq);
    } catch (PalisadeException | RuntimeException refused) {
      // Any refusal, or a failure of the gate's own statements, aborts the transaction.
      poison(conn);
      throw refused;
    }
  }

  /** Verify, lock the mark's row (creating it first if missing), decide, store. */
  private static Admitted steps(Connection conn, Verifier verifier, String token, String lock, Policy policy, long seq)
      throws PalisadeException {
    Claims claims = Gate.verifyForLock(verifier, token, lock);
    try {
      HighWater current = lockRow(conn, lock);
      if (current == null) {
        try (PreparedStatement create = conn.prepareStatement(CREATE_MARK)) {
          create.setString(1, lock);
          create.executeUpdate();
        }
        current = lockRow(conn, lock);
        if (current == null) {
          throw Gate.storageFailed("the mark of \"" + lock + "\" vanished after it was created", null);
        }
      }
      HighWater next = Gate.decide(current, policy, claims.epoch(), seq);
      try (PreparedStatement store = conn.prepareStatement(STORE_MARK)) {
        store.setLong(1, next.epoch());
        store.setLong(2, next.seq());
        store.setString(3, lock);
        store.executeUpdate();
      }
      return new Admitted(claims, current, next);
    } catch (SQLException e) {
      throw dbError(e);
    }
  }

  /** The locked mark, or null when the lock has no row yet. */
  private static HighWater lockRow(Connection conn, String lock) throws SQLException, PalisadeException {
    try (PreparedStatement select = conn.prepareStatement(LOCK_MARK)) {
      select.setString(1, lock);
      try (ResultSet row = select.executeQuery()) {
        return row.next() ? Gate.fromSql(row.getLong(1), row.getLong(2)) : null;
      }
    }
  }

  private static void poison(Connection conn) {
    try (Statement statement = conn.createStatement()) {
      statement.execute(POISON);
    } catch (SQLException expected) {
      // The failure is the point; if the connection is gone, the transaction cannot
      // commit anyway.
    }
  }

  /** Lost races are write_conflict (retry); anything else is storage_failed. */
  private static PalisadeException dbError(SQLException e) {
    if (e.getSQLState() != null && RETRY.contains(e.getSQLState())) {
      return Gate.conflict(e);
    }
    return Gate.storageFailed("PostgreSQL failed: " + e.getMessage(), e);
  }

  private static String migration() {
    try (InputStream in = PostgresGate.class.getResourceAsStream("postgres.sql")) {
      if (in == null) {
        throw new IllegalStateException("postgres.sql is missing from the package");
      }
      return new String(in.readAllBytes(), StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}

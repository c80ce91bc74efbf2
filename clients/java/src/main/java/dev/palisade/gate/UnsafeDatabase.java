// Preflight: the database settings that break the gate's durability, and the rule.
package dev.palisade.gate;

import java.util.ArrayList;
import java.util.List;

/**
 * Why a database cannot keep the gate's promise (S6): its settings that break it. The
 * cause of the {@code storage_failed} {@link dev.palisade.client.PalisadeException} that
 * {@link PostgresGate#preflight} and {@link PostgresGate#migrate} throw; {@link #settings}
 * names each one. The rule is the Rust gate's ({@code crates/adapters/src/preflight.rs}),
 * the Python and the Go gates'.
 */
public final class UnsafeDatabase extends Exception {
  private static final long serialVersionUID = 1L;

  /** A setting that breaks durability: its name, its value now, and what it needs to be. */
  public record Setting(String name, String value, String needs) {}

  /** Every unsafe setting, never empty. */
  private final List<Setting> settings;

  private UnsafeDatabase(String message, List<Setting> settings) {
    super(message);
    this.settings = List.copyOf(settings);
  }

  /** Every unsafe setting, never empty. */
  public List<Setting> settings() {
    return settings;
  }

  /**
   * The PostgreSQL rule: {@code fsync} and {@code full_page_writes} on; {@code
   * synchronous_commit} not {@code off}, and not {@code local} while synchronous standbys
   * are configured; streaming replicas only with {@code synchronous_standby_names} (a
   * failover to an asynchronous standby can lose marks). Returns the refusal, or null.
   */
  public static UnsafeDatabase checkPostgres(
      String fsync, String synchronousCommit, String fullPageWrites, String standbyNames, long replicas) {
    List<Setting> bad = new ArrayList<>();
    if (!"on".equals(fsync)) {
      bad.add(new Setting("fsync", fsync, "on"));
    }
    if (!"on".equals(fullPageWrites)) {
      bad.add(new Setting("full_page_writes", fullPageWrites, "on"));
    }
    boolean standbys = !standbyNames.isBlank();
    switch (synchronousCommit) {
      case "on", "remote_apply", "remote_write" -> { }
      case "local" -> {
        if (standbys) {
          bad.add(new Setting("synchronous_commit", synchronousCommit,
              "on, remote_write or remote_apply while synchronous standbys are configured"));
        }
      }
      default -> bad.add(new Setting("synchronous_commit", synchronousCommit, "on (or local without standbys)"));
    }
    if (replicas > 0 && !standbys) {
      bad.add(new Setting("synchronous_standby_names", standbyNames,
          "the streaming replicas named (they are asynchronous: a failover to one can lose marks)"));
    }
    if (bad.isEmpty()) {
      return null;
    }
    StringBuilder message = new StringBuilder("PostgreSQL cannot keep fenced writes durable: ");
    for (int i = 0; i < bad.size(); i++) {
      Setting s = bad.get(i);
      message.append(i == 0 ? "" : "; ").append(s.name()).append(" is \"").append(s.value())
          .append("\", needs ").append(s.needs());
    }
    message.append(" (docs/protecting-your-database.md, \"Preflight\"; migrateUnchecked skips this"
        + " check, for tests only)");
    return new UnsafeDatabase(message.toString(), bad);
  }
}

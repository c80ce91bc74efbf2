//! Preflight: whether the database can keep the gate's promise (S6).
//!
//! A gate's mark is as durable as the database's commit: a database that acknowledges a
//! commit before it is on disk can lose a mark in a crash, and then admit again a holder
//! it had fenced out. So before a gate is used, the database's own settings are read and
//! checked here, one pure rule per database; a setting that breaks S6 refuses with
//! [`UnsafeDatabase`], naming the setting, its value and what it needs to be.
//!
//! - PostgreSQL: `fsync` and `full_page_writes` on; `synchronous_commit` not `off`, and not
//!   `local` when synchronous standbys are configured; no streaming replicas without
//!   `synchronous_standby_names` (a failover to an asynchronous standby can lose marks).
//! - Redis: `appendonly yes` with `appendfsync always`.
//! - MySQL and MariaDB: `innodb_flush_log_at_trx_commit = 1`, and `sync_binlog = 1` when
//!   the binary log is on.
//!
//! ## What it does not check
//! - The disk and the kernel: a volatile write cache that lies about flushes defeats every
//!   setting here.
//! - A setting changed after the check: run it at every start of the application, not only
//!   at deploy time.

use std::fmt;

/// A database setting that breaks the gate's durability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsafeSetting {
    /// The setting, as the database names it.
    pub name: &'static str,
    /// Its value now.
    pub value: String,
    /// What it needs to be, in words.
    pub needs: &'static str,
}

/// The database cannot keep the gate's promise: its settings that break it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct UnsafeDatabase {
    /// Which database (`"PostgreSQL"`, `"Redis"`).
    pub database: &'static str,
    /// Every setting that breaks durability, never empty.
    pub settings: Vec<UnsafeSetting>,
}

impl fmt::Display for UnsafeDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} cannot keep fenced writes durable:", self.database)?;
        for (i, s) in self.settings.iter().enumerate() {
            let sep = if i == 0 { " " } else { "; " };
            write!(f, "{sep}{} is {:?}, needs {}", s.name, s.value, s.needs)?;
        }
        write!(
            f,
            " (docs/protecting-your-database.md, \"Preflight\"; the unchecked entry points skip \
             this check, for tests only)"
        )
    }
}

/// PostgreSQL's settings that the rule reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PostgresSettings {
    pub fsync: String,
    pub synchronous_commit: String,
    pub full_page_writes: String,
    pub synchronous_standby_names: String,
    /// Streaming replicas connected now (`pg_stat_replication`).
    pub replicas: i64,
}

/// The SQL that reads [`PostgresSettings`], in its field order.
pub const POSTGRES_SETTINGS: &str = "SELECT current_setting('fsync'), \
     current_setting('synchronous_commit'), current_setting('full_page_writes'), \
     current_setting('synchronous_standby_names'), \
     (SELECT count(*) FROM pg_stat_replication)";

/// The PostgreSQL rule: every setting of `s` that breaks durability.
pub fn postgres(s: &PostgresSettings) -> Result<(), UnsafeDatabase> {
    let mut bad = Vec::new();
    let mut flag = |name, value: &str, needs| {
        bad.push(UnsafeSetting {
            name,
            value: value.to_owned(),
            needs,
        })
    };
    if s.fsync != "on" {
        flag("fsync", &s.fsync, "on");
    }
    if s.full_page_writes != "on" {
        flag("full_page_writes", &s.full_page_writes, "on");
    }
    let standbys = !s.synchronous_standby_names.trim().is_empty();
    match s.synchronous_commit.as_str() {
        "on" | "remote_apply" | "remote_write" => {}
        "local" if !standbys => {}
        "local" => flag(
            "synchronous_commit",
            &s.synchronous_commit,
            "on, remote_write or remote_apply while synchronous standbys are configured",
        ),
        other => flag(
            "synchronous_commit",
            other,
            "on (or local without standbys)",
        ),
    }
    if s.replicas > 0 && !standbys {
        flag(
            "synchronous_standby_names",
            &s.synchronous_standby_names,
            "the streaming replicas named (they are asynchronous: a failover to one can \
             lose marks)",
        );
    }
    finish("PostgreSQL", bad)
}

/// The Redis rule, on `CONFIG GET appendonly` and `CONFIG GET appendfsync`.
pub fn redis(appendonly: &str, appendfsync: &str) -> Result<(), UnsafeDatabase> {
    let mut bad = Vec::new();
    if appendonly != "yes" {
        bad.push(UnsafeSetting {
            name: "appendonly",
            value: appendonly.to_owned(),
            needs: "yes",
        });
    }
    if appendfsync != "always" {
        bad.push(UnsafeSetting {
            name: "appendfsync",
            value: appendfsync.to_owned(),
            needs: "always (everysec can lose the last second of marks)",
        });
    }
    finish("Redis", bad)
}

/// The MySQL / MariaDB rule, on `@@innodb_flush_log_at_trx_commit`, `@@sync_binlog` and
/// `@@log_bin`: InnoDB's log flushed at every commit, and, with the binary log on, the
/// binary log synced at every commit too (a commit prepared in InnoDB but missing from an
/// unsynced binary log is rolled back by crash recovery, acknowledged or not).
pub fn mysql(
    innodb_flush_log_at_trx_commit: &str,
    sync_binlog: &str,
    log_bin: &str,
) -> Result<(), UnsafeDatabase> {
    let mut bad = Vec::new();
    if innodb_flush_log_at_trx_commit != "1" {
        bad.push(UnsafeSetting {
            name: "innodb_flush_log_at_trx_commit",
            value: innodb_flush_log_at_trx_commit.to_owned(),
            needs: "1 (0 and 2 can lose the last second of commits, marks among them)",
        });
    }
    let binlog_on = matches!(log_bin, "1" | "ON" | "on");
    if binlog_on && sync_binlog != "1" {
        bad.push(UnsafeSetting {
            name: "sync_binlog",
            value: sync_binlog.to_owned(),
            needs: "1 with the binary log on (crash recovery rolls back what the binary log \
                    lost)",
        });
    }
    finish("MySQL", bad)
}

fn finish(database: &'static str, settings: Vec<UnsafeSetting>) -> Result<(), UnsafeDatabase> {
    if settings.is_empty() {
        Ok(())
    } else {
        Err(UnsafeDatabase { database, settings })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn safe() -> PostgresSettings {
        PostgresSettings {
            fsync: "on".into(),
            synchronous_commit: "on".into(),
            full_page_writes: "on".into(),
            synchronous_standby_names: String::new(),
            replicas: 0,
        }
    }

    fn names(r: Result<(), UnsafeDatabase>) -> Vec<&'static str> {
        r.err()
            .map_or_else(Vec::new, |e| e.settings.iter().map(|s| s.name).collect())
    }

    #[test]
    fn postgres_refuses_each_unsafe_setting_by_name() {
        assert_eq!(names(postgres(&safe())), Vec::<&str>::new());
        let off = |f: fn(&mut PostgresSettings)| {
            let mut s = safe();
            f(&mut s);
            names(postgres(&s))
        };
        assert_eq!(off(|s| s.fsync = "off".into()), ["fsync"]);
        assert_eq!(
            off(|s| s.full_page_writes = "off".into()),
            ["full_page_writes"]
        );
        assert_eq!(
            off(|s| s.synchronous_commit = "off".into()),
            ["synchronous_commit"]
        );
        // `local` is durable on a lone primary, not with synchronous standbys.
        assert_eq!(
            off(|s| s.synchronous_commit = "local".into()),
            Vec::<&str>::new()
        );
        assert_eq!(
            off(|s| {
                s.synchronous_commit = "local".into();
                s.synchronous_standby_names = "standby1".into();
                s.replicas = 1;
            }),
            ["synchronous_commit"]
        );
        for ok in ["remote_write", "remote_apply"] {
            let mut s = safe();
            s.synchronous_commit = ok.into();
            assert!(postgres(&s).is_ok(), "{ok}");
        }
        // Replicas without synchronous standbys are asynchronous.
        assert_eq!(off(|s| s.replicas = 2), ["synchronous_standby_names"]);
        assert!(postgres(&PostgresSettings {
            synchronous_standby_names: "FIRST 1 (a, b)".into(),
            replicas: 2,
            ..safe()
        })
        .is_ok());
        // Every unsafe setting at once, each named once.
        let all = PostgresSettings {
            fsync: "off".into(),
            synchronous_commit: "off".into(),
            full_page_writes: "off".into(),
            synchronous_standby_names: String::new(),
            replicas: 1,
        };
        assert_eq!(
            names(postgres(&all)),
            [
                "fsync",
                "full_page_writes",
                "synchronous_commit",
                "synchronous_standby_names"
            ]
        );
    }

    #[test]
    fn mysql_needs_the_log_flushed_at_every_commit_and_the_binlog_synced_when_on() {
        assert!(
            mysql("1", "0", "0").is_ok(),
            "no binary log: sync_binlog does not matter"
        );
        assert!(mysql("1", "1", "1").is_ok());
        assert_eq!(
            names(mysql("2", "1", "1")),
            ["innodb_flush_log_at_trx_commit"]
        );
        assert_eq!(names(mysql("1", "0", "ON")), ["sync_binlog"]);
        assert_eq!(
            names(mysql("0", "100", "1")),
            ["innodb_flush_log_at_trx_commit", "sync_binlog"]
        );
    }

    #[test]
    fn redis_needs_the_append_only_file_synced_always() {
        assert!(redis("yes", "always").is_ok());
        assert_eq!(names(redis("yes", "everysec")), ["appendfsync"]);
        assert_eq!(names(redis("no", "always")), ["appendonly"]);
        assert_eq!(names(redis("no", "no")), ["appendonly", "appendfsync"]);
        let message = redis("yes", "everysec").unwrap_err().to_string();
        assert!(message.contains("appendfsync is \"everysec\""), "{message}");
    }
}

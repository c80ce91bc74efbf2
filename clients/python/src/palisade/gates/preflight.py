"""Preflight: whether the database can keep the gate's promise (S6).

A gate's mark is as durable as the database's commit: a database that acknowledges a
commit before it is on disk can lose a mark in a crash, and then admit again a holder it
had fenced out. So before a gate is used, the database's own settings are read and
checked here (the rule of the Rust ``palisade_adapters::preflight``); a setting that
breaks S6 raises :class:`UnsafeDatabaseError`, naming the setting, its value and what it
needs to be.

PostgreSQL: ``fsync`` and ``full_page_writes`` on; ``synchronous_commit`` not ``off``, and
not ``local`` while synchronous standbys are configured; streaming replicas only with
``synchronous_standby_names`` (a failover to an asynchronous standby can lose marks).

What it does not check: the disk itself (a write cache that lies about flushes defeats
every setting), nor a setting changed after the check: run it at every start of the
application, not only at deploy time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

from .._errors import StorageFailedError

__all__ = ["UnsafeSetting", "UnsafeDatabaseError", "POSTGRES_SETTINGS", "check_postgres"]

#: The SQL that reads the settings :func:`check_postgres` takes, in its argument order.
POSTGRES_SETTINGS = (
    "SELECT current_setting('fsync'), current_setting('synchronous_commit'), "
    "current_setting('full_page_writes'), current_setting('synchronous_standby_names'), "
    "(SELECT count(*) FROM pg_stat_replication)"
)


#: The settings :func:`check_mysql` judges, as one row of text.
MYSQL_SETTINGS = (
    "SELECT CAST(@@innodb_flush_log_at_trx_commit AS CHAR), CAST(@@sync_binlog AS CHAR), "
    "CAST(@@log_bin AS CHAR)"
)


@dataclass(frozen=True)
class UnsafeSetting:
    """A database setting that breaks the gate's durability."""

    name: str
    value: str
    needs: str


class UnsafeDatabaseError(StorageFailedError):
    """``storage_failed``: the database's settings cannot keep a mark durable; nothing was
    done. ``settings`` lists every setting that breaks it."""

    def __init__(self, database: str, settings: Sequence[UnsafeSetting]) -> None:
        parts = "; ".join(f"{s.name} is {s.value!r}, needs {s.needs}" for s in settings)
        super().__init__(
            f"{database} cannot keep fenced writes durable: {parts} "
            "(docs/protecting-your-database.md, \"Preflight\"; the unchecked entry points "
            "skip this check, for tests only)"
        )
        self.database = database
        self.settings = list(settings)


def check_postgres(
    fsync: str,
    synchronous_commit: str,
    full_page_writes: str,
    synchronous_standby_names: str,
    replicas: int,
) -> None:
    """The PostgreSQL rule: raises :class:`UnsafeDatabaseError` naming every unsafe
    setting, or returns."""
    bad: List[UnsafeSetting] = []
    if fsync != "on":
        bad.append(UnsafeSetting("fsync", fsync, "on"))
    if full_page_writes != "on":
        bad.append(UnsafeSetting("full_page_writes", full_page_writes, "on"))
    standbys = bool(synchronous_standby_names.strip())
    if synchronous_commit in ("on", "remote_apply", "remote_write"):
        pass
    elif synchronous_commit == "local":
        if standbys:
            bad.append(UnsafeSetting(
                "synchronous_commit", synchronous_commit,
                "on, remote_write or remote_apply while synchronous standbys are configured",
            ))
    else:
        bad.append(UnsafeSetting(
            "synchronous_commit", synchronous_commit, "on (or local without standbys)"
        ))
    if replicas > 0 and not standbys:
        bad.append(UnsafeSetting(
            "synchronous_standby_names", synchronous_standby_names,
            "the streaming replicas named (they are asynchronous: a failover to one can "
            "lose marks)",
        ))
    if bad:
        raise UnsafeDatabaseError("PostgreSQL", bad)


def check_mysql(innodb_flush_log_at_trx_commit: str, sync_binlog: str, log_bin: str) -> None:
    """The MySQL / MariaDB rule (the Rust gate's ``preflight::mysql``): InnoDB's log
    flushed at every commit, and with the binary log on, the binary log synced at every
    commit too. Raises :class:`UnsafeDatabaseError` naming every unsafe setting."""
    bad: List[UnsafeSetting] = []
    if innodb_flush_log_at_trx_commit != "1":
        bad.append(UnsafeSetting(
            "innodb_flush_log_at_trx_commit", innodb_flush_log_at_trx_commit,
            "1 (0 and 2 can lose the last second of commits, marks among them)",
        ))
    if log_bin in ("1", "ON", "on") and sync_binlog != "1":
        bad.append(UnsafeSetting(
            "sync_binlog", sync_binlog,
            "1 with the binary log on (crash recovery rolls back what the binary log lost)",
        ))
    if bad:
        raise UnsafeDatabaseError("MySQL", bad)

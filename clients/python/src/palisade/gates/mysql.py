"""The gate inside a MySQL or MariaDB transaction (PyMySQL, on InnoDB), sharing
``palisade_fence`` and its rules with the Rust ``palisade_adapters::mysql``.

::

    import pymysql
    from palisade.gates import mysql

    conn = pymysql.connect(host="db.internal", user="app", database="orders")
    mysql.migrate(conn)                          # once: checks the settings, creates the table
    mysql.preflight(conn)                        # at every start of the application
    with mysql.transaction(conn):                # commit, or roll back on any exception
        mysql.admit(conn, verifier, token, "orders")
        with conn.cursor() as cur:
            cur.execute("UPDATE orders SET state = 'shipped' WHERE id = %s", (42,))

How it serialises: :func:`admit` locks the lock's row of ``palisade_fence`` with
``SELECT ... FOR UPDATE`` (a locking read sees the newest committed mark at any isolation
level), creating the row first if the database has never seen the lock; a second
transaction admitting for the same lock (from Python or Rust) waits on that row lock. A
deadlock or a lock wait timeout is :class:`ConflictError`: roll back and retry.

On a refusal, roll back. MySQL cannot mark a transaction as failed from inside it: after
:func:`admit` raises, committing would commit the caller's own earlier writes without a
valid admission. :func:`transaction` rolls back on any exception.

Durability: :func:`preflight` refuses a server that acknowledges commits before they are
durable (``innodb_flush_log_at_trx_commit`` not 1, or ``sync_binlog`` not 1 with the
binary log on), by the same rule as the Rust gate.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import pymysql

from .._errors import ConflictError, PalisadeError, StorageFailedError
from .._stepper import Stepper
from ..tokens import Verifier
from . import Admitted, AdmitSteps, Ask, HighWater, Policy, committing, from_sql_mark, mapped, migration, row_locked_steps
from .preflight import MYSQL_SETTINGS, check_mysql
from .report import GateTally

__all__ = ["MIGRATION", "preflight", "migrate", "migrate_unchecked", "transaction", "admit", "admit_sequenced", "high_water"]

#: The SQL that creates the fence table (``crates/adapters/migrations/mysql.sql``).
MIGRATION = migration("mysql")

SELECT_MARK = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = %s"
LOCK_MARK = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = %s FOR UPDATE"
# Not INSERT IGNORE: that would also swallow a refused lock name (the CHECK).
CREATE_MARK = (
    "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES (%s, 0, 0) "
    "ON DUPLICATE KEY UPDATE lock_name = lock_name"
)
STORE_MARK = (
    "UPDATE palisade_fence SET epoch = %s, seq = %s, updated_at = CURRENT_TIMESTAMP(6) "
    "WHERE lock_name = %s"
)

# ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT: lost races.
_RETRY = (1213, 1205)


def _db_error(e: pymysql.MySQLError) -> PalisadeError:
    code = e.args[0] if e.args and isinstance(e.args[0], int) else None
    if code in _RETRY:
        error: PalisadeError = ConflictError("concurrent update of the fenced resource; retry")
    else:
        error = StorageFailedError(f"MySQL failed: {e}")
    error.__cause__ = e
    return error


def _mapped() -> "contextlib.AbstractContextManager[None]":
    return mapped(pymysql.MySQLError, _db_error)


def preflight(conn: "pymysql.connections.Connection[Any]") -> None:
    """Checks that the server can keep a mark durable (:mod:`palisade.gates.preflight`):
    raises :class:`UnsafeDatabaseError` naming every setting that breaks it. Run it when
    the application starts; :func:`migrate` runs it too."""
    with _mapped(), conn.cursor() as cur:
        cur.execute(MYSQL_SETTINGS)
        row = cur.fetchone()
    if row is None:
        raise StorageFailedError("MySQL answered no row to the settings query")
    check_mysql(str(row[0]), str(row[1]), str(row[2]))


def migrate(conn: "pymysql.connections.Connection[Any]") -> None:
    """Checks the server's settings (:func:`preflight`), then creates the fence table if
    it does not exist (idempotent). Run it once at deploy time."""
    preflight(conn)
    migrate_unchecked(conn)


def migrate_unchecked(conn: "pymysql.connections.Connection[Any]") -> None:
    """:func:`migrate` without the settings check: for a server whose durability is
    ensured some other way, and for tests on a throwaway server."""
    with _mapped(), conn.cursor() as cur:
        cur.execute(MIGRATION)


def transaction(conn: "pymysql.connections.Connection[Any]") -> "contextlib.AbstractContextManager[pymysql.connections.Connection[Any]]":
    """``with transaction(conn):`` begins a transaction, commits when the block succeeds
    and rolls back when it raises (a refused admit included)."""

    def begin() -> None:
        with _mapped():
            conn.begin()

    return committing(conn, begin, pymysql.MySQLError, _db_error)


def admit(conn: "pymysql.connections.Connection[Any]", verifier: Verifier, token: Any, lock: str, *, tally: "Optional[GateTally]" = None) -> Admitted:
    """Admits ``token`` for ``lock`` inside ``conn``'s transaction under the epoch policy:
    an equal or larger epoch passes and raises the mark, a smaller one is refused with
    :class:`StaleTokenError`. On a refusal, roll the transaction back."""
    return _run(conn, _steps(Ask(verifier, token, lock, Policy.EPOCH, None, tally, "mysql")))


def admit_sequenced(conn: "pymysql.connections.Connection[Any]", verifier: Verifier, token: Any, lock: str, seq: int, *, tally: "Optional[GateTally]" = None) -> Admitted:
    """Like :func:`admit` under the sequence policy: (epoch, ``seq``) must strictly exceed
    the mark (:class:`StaleSequenceError`). Use one policy per lock."""
    return _run(conn, _steps(Ask(verifier, token, lock, Policy.SEQUENCE, seq, tally, "mysql")))


def high_water(conn: "pymysql.connections.Connection[Any]", lock: str) -> HighWater:
    """The lock's committed mark as this connection sees it, or ``HighWater()`` if never
    admitted. For inspection only (S6)."""
    with _mapped(), conn.cursor() as cur:
        cur.execute(SELECT_MARK, (lock,))
        row = cur.fetchone()
    return HighWater() if row is None else from_sql_mark(row[0], row[1])


def _steps(ask: Ask) -> AdmitSteps:
    return row_locked_steps(ask, LOCK_MARK, CREATE_MARK, STORE_MARK)


def _run(conn: "pymysql.connections.Connection[Any]", steps: AdmitSteps) -> Admitted:
    if conn.get_autocommit():
        raise ValueError(
            "mysql.admit must run inside a transaction (with mysql.transaction(conn): ...); "
            "with autocommit on, each statement would commit on its own"
        )
    with _mapped(), conn.cursor() as cur:
        run = Stepper(steps)
        for step in run:
            cur.execute(step.sql, step.params)
            run.got(cur.fetchone() if step.fetch else None)
    return run.value

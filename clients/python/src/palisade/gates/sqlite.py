"""The gate inside a SQLite transaction (the stdlib ``sqlite3``), sharing
``palisade_fence`` and its rules with the Rust ``palisade_adapters::sqlite``.

::

    import sqlite3
    from palisade.gates import sqlite

    conn = sqlite3.connect("app.db", timeout=30, isolation_level=None)
    sqlite.migrate(conn)
    with sqlite.transaction(conn):                 # BEGIN IMMEDIATE; commit or roll back
        sqlite.admit(conn, verifier, token, "orders")
        conn.execute("UPDATE orders SET state = 'shipped' WHERE id = ?", (42,))

How it serialises: SQLite has one writer at a time per database file.
:func:`transaction` (and :func:`begin`) open the transaction with ``BEGIN IMMEDIATE``,
which takes the write lock up front, so the mark :func:`admit` reads cannot change before
the transaction ends, whichever process (Python or Rust) writes next. A transaction opened
with a plain ``BEGIN`` (deferred) is still safe: SQLite refuses to let a reader whose
snapshot went stale write, which surfaces as :class:`ConflictError` (roll back and retry).
Give connections a busy timeout (``sqlite3.connect(..., timeout=30)``) so writers queue
instead of failing at once.

On a refusal, roll back. SQLite cannot mark a transaction as failed from inside it: after
:func:`admit` raises, the transaction is still open and writable, and committing it would
commit the caller's own earlier writes without a valid admission. :func:`transaction`
rolls back on any exception.

Durability: ``COMMIT`` is durable only under ``PRAGMA synchronous = FULL`` (the default in
rollback-journal mode; in WAL mode the default ``NORMAL`` can lose the last commits, mark
included, on power loss).
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any, Optional

from .._errors import ConflictError, PalisadeError, StorageFailedError
from .._stepper import Stepper
from ..tokens import Verifier
from . import Admitted, AdmitSteps, Ask, HighWater, Policy, Step, admit_steps, committing, from_sql_mark, migration
from .report import GateTally

__all__ = ["MIGRATION", "migrate", "begin", "transaction", "admit", "admit_sequenced", "high_water"]

#: The SQL that creates the fence table (``crates/adapters/migrations/sqlite.sql``).
MIGRATION = migration("sqlite")

SELECT_MARK = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = ?"
STORE_MARK = (
    "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES (?, ?, ?) "
    "ON CONFLICT (lock_name) DO UPDATE SET epoch = excluded.epoch, seq = excluded.seq, "
    "updated_at = CAST(strftime('%s', 'now') AS INTEGER)"
)

_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


def _db_error(e: sqlite3.Error) -> PalisadeError:
    """A busy or locked database is a lost race (:class:`ConflictError`); anything else
    is a backend failure."""
    code = getattr(e, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        busy = code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    else:
        busy = isinstance(e, sqlite3.OperationalError) and "locked" in str(e)
    if busy:
        error: PalisadeError = ConflictError("concurrent update of the fenced resource; retry")
    else:
        error = StorageFailedError(f"SQLite failed: {e}")
    error.__cause__ = e
    return error


def migrate(conn: sqlite3.Connection) -> None:
    """Creates the fence table if it does not exist (idempotent). Run it outside a
    transaction."""
    if conn.in_transaction:
        raise ValueError("sqlite.migrate must run outside a transaction")
    try:
        conn.executescript(MIGRATION)
    except sqlite3.Error as e:
        raise _db_error(e) from e


def begin(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE``: the write lock is taken now, so two admits on this database
    run one after the other. End it with ``conn.commit()`` or ``conn.rollback()``."""
    if conn.in_transaction:
        raise ValueError(
            "the connection is already in a transaction; open it with "
            "isolation_level=None (or the default) and let the gate begin"
        )
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as e:
        raise _db_error(e) from e


def transaction(conn: sqlite3.Connection) -> "contextlib.AbstractContextManager[sqlite3.Connection]":
    """``with transaction(conn):`` opens ``BEGIN IMMEDIATE``, commits when the block
    succeeds and rolls back when it raises (a refused admit included)."""
    return committing(conn, lambda: begin(conn), sqlite3.Error, _db_error)


def admit(conn: sqlite3.Connection, verifier: Verifier, token: Any, lock: str, *, tally: "Optional[GateTally]" = None) -> Admitted:
    """Admits ``token`` for ``lock`` inside ``conn``'s open transaction under the epoch
    policy: an equal or larger epoch passes and raises the mark, a smaller one is refused
    with :class:`StaleTokenError`. On a refusal, roll the transaction back."""
    return _run(conn, _steps(Ask(verifier, token, lock, Policy.EPOCH, None, tally, "sqlite")))


def admit_sequenced(conn: sqlite3.Connection, verifier: Verifier, token: Any, lock: str, seq: int, *, tally: "Optional[GateTally]" = None) -> Admitted:
    """Like :func:`admit` under the sequence policy: (epoch, ``seq``) must strictly exceed
    the mark (:class:`StaleSequenceError`). Use one policy per lock: an epoch-policy admit
    resets the stored sequence to 0."""
    return _run(conn, _steps(Ask(verifier, token, lock, Policy.SEQUENCE, seq, tally, "sqlite")))


def high_water(conn: sqlite3.Connection, lock: str) -> HighWater:
    """The lock's committed mark, or ``HighWater()`` if never admitted. For inspection
    only: a decision made on it outside the writing transaction re-opens the race (S6)."""
    try:
        row = conn.execute(SELECT_MARK, (lock,)).fetchone()
    except sqlite3.Error as e:
        raise _db_error(e) from e
    return HighWater() if row is None else from_sql_mark(row[0], row[1])


def _steps(ask: Ask) -> AdmitSteps:
    lock = ask.lock
    return admit_steps(
        ask,
        read_mark=Step(SELECT_MARK, (lock,), fetch=True),
        create_mark=None,
        store_mark=lambda hw: Step(STORE_MARK, (lock, hw.epoch, hw.seq), fetch=False),
    )


def _run(conn: sqlite3.Connection, steps: AdmitSteps) -> Admitted:
    if not conn.in_transaction:
        raise ValueError(
            "sqlite.admit must run inside a transaction (with sqlite.transaction(conn): ...); "
            "otherwise the mark is read and written outside the caller's unit of work"
        )
    try:
        run = Stepper(steps)
        for step in run:
            cursor = conn.execute(step.sql, step.params)
            run.got(cursor.fetchone() if step.fetch else None)
    except sqlite3.Error as e:
        raise _db_error(e) from e
    return run.value

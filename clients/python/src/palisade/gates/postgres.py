"""The gate inside a PostgreSQL transaction (psycopg 3), sharing ``palisade_fence`` and its
rules with the Rust ``palisade_adapters::postgres``.

::

    import psycopg
    from palisade.gates import postgres

    with psycopg.connect(dsn) as conn:
        postgres.migrate(conn)                     # at deploy time: checks, then creates
        postgres.preflight(conn)                   # at every start of the application
        with conn.transaction():                   # commits, or rolls back on an exception
            postgres.admit(conn, verifier, token, "orders")
            conn.execute("UPDATE orders SET state = 'shipped' WHERE id = %s", (42,))

For asyncio (``psycopg.AsyncConnection``): ``await postgres.admit_async(...)``.

How it serialises: :func:`admit` locks the lock's row of ``palisade_fence`` with
``SELECT ... FOR UPDATE`` (creating it first with ``INSERT ... ON CONFLICT DO NOTHING``
if the database has never seen the lock). A second transaction admitting for the same
lock, from Python or from Rust, waits on that row lock until the first commits or rolls
back, then reads the mark it left. Admits for different locks do not wait on each other.
Under ``REPEATABLE READ`` or ``SERIALIZABLE``, PostgreSQL refuses to lock a row changed
after the snapshot was taken: that is :class:`ConflictError`; roll back and retry.

A refusal poisons the transaction: when :func:`admit` raises, it has also raised an error
inside PostgreSQL, which marks the transaction aborted, so every later statement fails
and ``COMMIT`` becomes a rollback. Writes the caller made before ``admit`` can never
commit alongside a refused token, even if the caller swallows the exception. (A
savepoint rolled back to after the refusal would clear that state: do not admit inside a
savepoint you then roll back to and carry on.)

The connection must be in a transaction for the mark and the writes to be one unit: an
autocommit connection outside ``conn.transaction()`` is refused with ``ValueError``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

try:
    import psycopg
    import psycopg.errors
    from psycopg.pq import TransactionStatus
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "palisade.gates.postgres needs psycopg 3: pip install 'palisade-client[postgres]'"
    ) from e

from .._errors import ConflictError, PalisadeError, StorageFailedError
from .._stepper import Stepper
from ..tokens import Verifier
from . import Admitted, AdmitSteps, Ask, HighWater, Policy, from_sql_mark, mapped, migration, row_locked_steps
from .preflight import POSTGRES_SETTINGS, UnsafeDatabaseError, check_postgres
from .report import GateTally

__all__ = ["MIGRATION", "preflight", "preflight_async", "migrate", "migrate_async",
           "migrate_unchecked", "migrate_unchecked_async", "admit", "admit_sequenced",
           "admit_async", "admit_sequenced_async", "high_water", "high_water_async",
           "UnsafeDatabaseError"]

#: The SQL that creates the fence table (``crates/adapters/migrations/postgres.sql``).
MIGRATION = migration("postgres")

SELECT_MARK = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = %s"
LOCK_MARK = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = %s FOR UPDATE"
CREATE_MARK = (
    "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES (%s, 0, 0) "
    "ON CONFLICT (lock_name) DO NOTHING"
)
STORE_MARK = "UPDATE palisade_fence SET epoch = %s, seq = %s, updated_at = now() WHERE lock_name = %s"
#: Raising an error is how a refusal is made final: PostgreSQL will not commit a
#: transaction that saw one.
POISON = "DO $$ BEGIN RAISE EXCEPTION 'palisade: fenced operation refused; roll back'; END $$"

_RETRY = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
)


def _db_error(e: psycopg.Error) -> PalisadeError:
    """Lost races become :class:`ConflictError` (retry); anything else is a backend
    failure."""
    if isinstance(e, _RETRY):
        error: PalisadeError = ConflictError("concurrent update of the fenced resource; retry")
    else:
        error = StorageFailedError(f"PostgreSQL failed: {e}")
    error.__cause__ = e
    return error


def _steps(ask: Ask) -> AdmitSteps:
    return row_locked_steps(ask, LOCK_MARK, CREATE_MARK, STORE_MARK)


def _require_transaction(conn: Any) -> None:
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        raise ValueError(
            "postgres.admit must run inside a transaction (with conn.transaction(): ...); "
            "on an autocommit connection each statement would commit on its own"
        )


def preflight(conn: "psycopg.Connection[Any]") -> None:
    """Checks that the database can keep a mark durable (:mod:`palisade.gates.preflight`:
    ``fsync``, ``synchronous_commit``, ``full_page_writes``, and synchronous standbys when
    streaming replicas are connected): raises :class:`UnsafeDatabaseError` naming every
    setting that breaks it. Run it when the application starts; :func:`migrate` runs it
    too."""
    try:
        with conn.transaction():
            row = conn.execute(POSTGRES_SETTINGS).fetchone()
    except psycopg.Error as e:
        raise _db_error(e) from e
    if row is None:
        raise StorageFailedError("PostgreSQL answered no row to the settings query")
    check_postgres(str(row[0]), str(row[1]), str(row[2]), str(row[3]), int(row[4]))


def migrate(conn: "psycopg.Connection[Any]") -> None:
    """Checks the database's settings (:func:`preflight`), then creates the fence table if
    it does not exist (idempotent) and commits it. Run it once at deploy time, not
    concurrently from many processes."""
    preflight(conn)
    migrate_unchecked(conn)


def migrate_unchecked(conn: "psycopg.Connection[Any]") -> None:
    """:func:`migrate` without the settings check: for a database whose durability is
    ensured some other way, and for tests on a throwaway database."""
    try:
        with conn.transaction():
            conn.execute(MIGRATION)
    except psycopg.Error as e:
        raise _db_error(e) from e


def admit(conn: "psycopg.Connection[Any]", verifier: Verifier, token: Any, lock: str, *, tally: "Optional[GateTally]" = None) -> Admitted:
    """Admits ``token`` for ``lock`` inside ``conn``'s transaction under the epoch policy:
    an equal or larger epoch passes and raises the mark, a smaller one is refused with
    :class:`StaleTokenError`. On success the new mark is part of the transaction and
    commits or rolls back with the caller's writes; on a refusal the transaction is
    aborted and must be rolled back."""
    return _run(conn, _steps(Ask(verifier, token, lock, Policy.EPOCH, None, tally, "postgres")))


def admit_sequenced(
    conn: "psycopg.Connection[Any]", verifier: Verifier, token: Any, lock: str, seq: int, *, tally: "Optional[GateTally]" = None
) -> Admitted:
    """Like :func:`admit` under the sequence policy: (epoch, ``seq``) must strictly exceed
    the mark, so a delayed or replayed operation of the current holder is refused too
    (:class:`StaleSequenceError`). Use one policy per lock: an epoch-policy admit resets
    the stored sequence to 0."""
    return _run(conn, _steps(Ask(verifier, token, lock, Policy.SEQUENCE, seq, tally, "postgres")))


def high_water(conn: "psycopg.Connection[Any]", lock: str) -> HighWater:
    """The lock's committed mark as this connection sees it, or ``HighWater()`` if never
    admitted. For inspection only: deciding on it outside the transaction that writes
    would re-open the check-then-write race (S6)."""
    try:
        row = conn.execute(SELECT_MARK, (lock,)).fetchone()
    except psycopg.Error as e:
        raise _db_error(e) from e
    return HighWater() if row is None else from_sql_mark(row[0], row[1])


def _run(conn: "psycopg.Connection[Any]", steps: AdmitSteps) -> Admitted:
    _require_transaction(conn)
    try:
        with _mapped():
            run = Stepper(steps)
            for step in run:
                cursor = conn.execute(step.sql, step.params)
                run.got(cursor.fetchone() if step.fetch else None)
    except Exception:
        # Any refusal, or a failure of the gate's own statements, aborts the transaction.
        _poison(conn)
        raise
    return run.value


def _mapped() -> "contextlib.AbstractContextManager[None]":
    """PostgreSQL's failures as the gate's errors."""
    return mapped(psycopg.Error, _db_error)


def _poison(conn: "psycopg.Connection[Any]") -> None:
    try:
        conn.execute(POISON)
    except psycopg.Error:
        # Expected: the failure is the point. If the connection itself is gone, the
        # transaction cannot commit anyway.
        pass


# ---- asyncio (psycopg.AsyncConnection) -------------------------------------------------


async def preflight_async(conn: "psycopg.AsyncConnection[Any]") -> None:
    """:func:`preflight` for an ``AsyncConnection``."""
    try:
        async with conn.transaction():
            cursor = await conn.execute(POSTGRES_SETTINGS)
            row = await cursor.fetchone()
    except psycopg.Error as e:
        raise _db_error(e) from e
    if row is None:
        raise StorageFailedError("PostgreSQL answered no row to the settings query")
    check_postgres(str(row[0]), str(row[1]), str(row[2]), str(row[3]), int(row[4]))


async def migrate_async(conn: "psycopg.AsyncConnection[Any]") -> None:
    """:func:`migrate` for an ``AsyncConnection``."""
    await preflight_async(conn)
    await migrate_unchecked_async(conn)


async def migrate_unchecked_async(conn: "psycopg.AsyncConnection[Any]") -> None:
    """:func:`migrate_unchecked` for an ``AsyncConnection``."""
    try:
        async with conn.transaction():
            await conn.execute(MIGRATION)
    except psycopg.Error as e:
        raise _db_error(e) from e


async def admit_async(
    conn: "psycopg.AsyncConnection[Any]", verifier: Verifier, token: Any, lock: str, *, tally: "Optional[GateTally]" = None
) -> Admitted:
    """:func:`admit` for an ``AsyncConnection``."""
    return await _run_async(conn, _steps(Ask(verifier, token, lock, Policy.EPOCH, None, tally, "postgres")))


async def admit_sequenced_async(
    conn: "psycopg.AsyncConnection[Any]", verifier: Verifier, token: Any, lock: str, seq: int, *, tally: "Optional[GateTally]" = None
) -> Admitted:
    """:func:`admit_sequenced` for an ``AsyncConnection``."""
    return await _run_async(conn, _steps(Ask(verifier, token, lock, Policy.SEQUENCE, seq, tally, "postgres")))


async def high_water_async(conn: "psycopg.AsyncConnection[Any]", lock: str) -> HighWater:
    """:func:`high_water` for an ``AsyncConnection``."""
    try:
        row = await (await conn.execute(SELECT_MARK, (lock,))).fetchone()
    except psycopg.Error as e:
        raise _db_error(e) from e
    return HighWater() if row is None else from_sql_mark(row[0], row[1])


async def _run_async(conn: "psycopg.AsyncConnection[Any]", steps: AdmitSteps) -> Admitted:
    _require_transaction(conn)
    try:
        with _mapped():
            run = Stepper(steps)
            for step in run:
                cursor = await conn.execute(step.sql, step.params)
                run.got(await cursor.fetchone() if step.fetch else None)
    except Exception:
        try:
            await conn.execute(POISON)
        except psycopg.Error:
            pass  # expected, as in _poison
        raise
    return run.value

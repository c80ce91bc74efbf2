"""The two Python gates behind one small interface, so the shared cases (test_gates.py)
run against both, as the Rust adapters' suite (crates/adapters/tests/support/suite.rs)
runs against each Rust adapter. Each method is one complete operation: a fenced write
opens its own connection and transaction, admits, writes and commits, or rolls back."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any, ContextManager, Optional

import psycopg
import pymysql

from palisade import ConflictError
from palisade.gates import Admitted, mysql, postgres, sqlite
from palisade.gates.report import GateTally
from palisade.tokens import Verifier

PG_UPSERT = "INSERT INTO kv (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
MYSQL_UPSERT = "INSERT INTO kv (`key`, value) VALUES (%s, %s) ON DUPLICATE KEY UPDATE value = VALUES(value)"
SQLITE_UPSERT = "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"


class Rollback(Exception):
    """The caller's own step after the admit fails."""


class _Gate:
    """One gate's operations; the subclasses say how to connect and open a transaction."""

    name = ""
    module: Any = None
    upsert = ""
    select = ""

    def __init__(self, target: str, verifier: Verifier) -> None:
        self.target = target
        self.verifier = verifier
        #: Every admit of this gate counts in it.
        self.tally = GateTally()

    def session(self) -> ContextManager[Any]:
        """A connection, closed at the end of the block."""
        raise NotImplementedError

    def transaction(self, conn: Any) -> ContextManager[Any]:
        raise NotImplementedError

    def run(self, token: Any, lock: str, key: str, value: str, own_key: Optional[str] = None,
            fail_after: bool = False, seq: Optional[int] = None) -> Admitted:
        """A fenced write in its own transaction: ``own_key`` is written before the admit,
        and ``fail_after`` fails the transaction after the write."""
        with self.session() as conn, self.transaction(conn):
            if own_key is not None:
                conn.execute(self.upsert, (own_key, "own"))
            if seq is None:
                admitted: Admitted = self.module.admit(conn, self.verifier, token, lock, tally=self.tally)
            else:
                admitted = self.module.admit_sequenced(conn, self.verifier, token, lock, seq, tally=self.tally)
            conn.execute(self.upsert, (key, value))
            if fail_after:
                raise Rollback()
        return admitted

    def read(self, key: str) -> Optional[str]:
        with self.session() as conn:
            row = conn.execute(self.select, (key,)).fetchone()
            return None if row is None else str(row[0])

    def high_water(self, lock: str) -> int:
        with self.session() as conn:
            return int(self.module.high_water(conn, lock).epoch)


class SqliteGate(_Gate):
    name = "sqlite"
    module = sqlite
    upsert = SQLITE_UPSERT
    select = "SELECT value FROM kv WHERE key = ?"

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.target, timeout=30, isolation_level=None)

    def session(self) -> ContextManager[sqlite3.Connection]:
        return contextlib.closing(self.connect())

    def transaction(self, conn: sqlite3.Connection) -> ContextManager[Any]:
        return sqlite.transaction(conn)


class PgGate(_Gate):
    name = "postgres"
    module = postgres
    upsert = PG_UPSERT
    select = "SELECT value FROM kv WHERE key = %s"

    def connect(self) -> "psycopg.Connection[Any]":
        return psycopg.connect(self.target)

    def session(self) -> "psycopg.Connection[Any]":
        return self.connect()

    def transaction(self, conn: "psycopg.Connection[Any]") -> ContextManager[Any]:
        return conn.transaction()


class _Cursored:
    """A PyMySQL connection with ``execute`` (what the other drivers' connections have),
    for the shared operations above."""

    def __init__(self, conn: "pymysql.connections.Connection[Any]") -> None:
        self.conn = conn

    def execute(self, sql: str, params: Any = None) -> Any:
        cur = self.conn.cursor()
        cur.execute(sql, params)
        return cur

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)  # the gate's own calls: cursor, begin, commit, ...


class MySqlGate(_Gate):
    name = "mysql"
    module = mysql
    upsert = MYSQL_UPSERT
    select = "SELECT value FROM kv WHERE `key` = %s"

    def __init__(self, target: Any, verifier: Verifier) -> None:
        super().__init__("", verifier)
        self.args = target

    def session(self) -> ContextManager[Any]:
        @contextlib.contextmanager
        def opened() -> Any:
            conn = pymysql.connect(**self.args)
            try:
                yield _Cursored(conn)
            finally:
                conn.close()
        return opened()

    def transaction(self, conn: Any) -> ContextManager[Any]:
        return mysql.transaction(conn)


Gate = Any  # SqliteGate, PgGate or MySqlGate


def write(gate: Gate, token: Any, lock: str, key: str, value: str) -> None:
    gate.run(token, lock, key, value)


def write_retrying(gate: Gate, token: Any, lock: str, key: str, value: str) -> None:
    """Retries a write that lost a race (:class:`ConflictError`), as the docs tell users."""
    for _ in range(1000):
        try:
            gate.run(token, lock, key, value)
            return
        except ConflictError:
            continue
    raise AssertionError("an operation lost 1000 races in a row")

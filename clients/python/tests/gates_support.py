"""The two Python gates behind one small interface, so the shared cases (test_gates.py)
run against both, as the Rust adapters' suite (crates/adapters/tests/support/suite.rs)
runs against each Rust adapter. Each method is one complete operation: a fenced write
opens its own connection and transaction, admits, writes and commits, or rolls back."""

from __future__ import annotations

import sqlite3
from typing import Any, Optional

import psycopg

from palisade import ConflictError
from palisade.gates import postgres, sqlite
from palisade.tokens import Verifier

PG_UPSERT = "INSERT INTO kv (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
SQLITE_UPSERT = "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"


class Rollback(Exception):
    """The caller's own step after the admit fails."""


class SqliteGate:
    name = "sqlite"

    def __init__(self, path: str, verifier: Verifier) -> None:
        self.path = path
        self.verifier = verifier

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def run(self, token: Any, lock: str, key: str, value: str, own_key: Optional[str] = None,
            fail_after: bool = False, seq: Optional[int] = None) -> None:
        conn = self.connect()
        try:
            with sqlite.transaction(conn):
                if own_key is not None:
                    conn.execute(SQLITE_UPSERT, (own_key, "own"))
                if seq is None:
                    sqlite.admit(conn, self.verifier, token, lock)
                else:
                    sqlite.admit_sequenced(conn, self.verifier, token, lock, seq)
                conn.execute(SQLITE_UPSERT, (key, value))
                if fail_after:
                    raise Rollback()
        finally:
            conn.close()

    def read(self, key: str) -> Optional[str]:
        conn = self.connect()
        try:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            return None if row is None else str(row[0])
        finally:
            conn.close()

    def high_water(self, lock: str) -> int:
        conn = self.connect()
        try:
            return sqlite.high_water(conn, lock).epoch
        finally:
            conn.close()


class PgGate:
    name = "postgres"

    def __init__(self, dsn: str, verifier: Verifier) -> None:
        self.dsn = dsn
        self.verifier = verifier

    def connect(self) -> "psycopg.Connection[Any]":
        return psycopg.connect(self.dsn)

    def run(self, token: Any, lock: str, key: str, value: str, own_key: Optional[str] = None,
            fail_after: bool = False, seq: Optional[int] = None) -> None:
        with self.connect() as conn:
            with conn.transaction():
                if own_key is not None:
                    conn.execute(PG_UPSERT, (own_key, "own"))
                if seq is None:
                    postgres.admit(conn, self.verifier, token, lock)
                else:
                    postgres.admit_sequenced(conn, self.verifier, token, lock, seq)
                conn.execute(PG_UPSERT, (key, value))
                if fail_after:
                    raise Rollback()

    def read(self, key: str) -> Optional[str]:
        with self.connect() as conn:
            row = conn.execute("SELECT value FROM kv WHERE key = %s", (key,)).fetchone()
            return None if row is None else str(row[0])

    def high_water(self, lock: str) -> int:
        with self.connect() as conn:
            return postgres.high_water(conn, lock).epoch


Gate = Any  # SqliteGate or PgGate


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

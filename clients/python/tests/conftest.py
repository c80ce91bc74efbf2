"""Fixtures: real servers (started once per session, or per test where a test kills or
configures one), a test issuer, and per-test databases."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import sqlite3
import uuid
from pathlib import Path
from typing import Iterator, Protocol, TypeVar

import nacl.signing
import psycopg
import pymysql
import pytest

from palisade import Client
from palisade.gates import sqlite as sqlite_gate
from palisade.gates import mysql as mysql_gate
from palisade.gates import postgres as pg_gate
from palisade.tokens import KeyRing, Verifier

from servers import MariaDBServer, PalisadeServer, PostgresServer

#: The lock guarding the scenario's data, and another whose tokens must never write it.
LOCK = "orders"
OTHER_LOCK = "payments"


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class Issuer:
    """Plays the issuer in gate tests: mints genuine tokens with its own Ed25519 key.

    Its payload encoding (``json.dumps`` with compact separators) is written apart from
    ``palisade.tokens.canonical_payload`` on purpose, so the tests do not check the
    verifier against itself; the cross-language tests check both against Rust.
    """

    def __init__(self) -> None:
        self.key = nacl.signing.SigningKey.generate()
        self.public = bytes(self.key.verify_key)
        self.key_id = hashlib.sha256(self.public).digest()[:8].hex()
        ring = KeyRing()
        ring.add(self.public)
        self.verifier = Verifier(ring, 1024)

    def sign_payload(self, payload: bytes) -> str:
        signed = "pal1." + b64(payload)
        return signed + "." + b64(self.key.sign(signed.encode()).signature)

    def token(self, lock: str, epoch: int, holder: str = "") -> str:
        claims = {"l": lock, "e": epoch, "h": holder or f"holder-{epoch}", "k": self.key_id}
        payload = json.dumps(claims, separators=(",", ":"), ensure_ascii=False).encode()
        return self.sign_payload(payload)


@pytest.fixture
def issuer() -> Issuer:
    return Issuer()


class Stoppable(Protocol):
    def stop(self) -> None: ...


ServerT = TypeVar("ServerT", bound=Stoppable)


def running(server: ServerT) -> Iterator[ServerT]:
    """A session fixture's body: yields ``server``, stops it after the session."""
    yield server
    server.stop()


def fresh_database_name() -> str:
    """A schema or database name no other test uses."""
    return "t_" + uuid.uuid4().hex[:16]


@pytest.fixture(scope="session")
def server() -> Iterator[PalisadeServer]:
    """One server for the tests that only need a server; each test uses its own lock
    names. Namespaces ``seq-*`` use the sequence policy."""
    yield from running(PalisadeServer(["--policy", "seq-*=sequence", "--max-value-bytes", "4096"]))


@pytest.fixture
def client(server: PalisadeServer) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c


@pytest.fixture
def lock_name() -> str:
    """A lock name no other test uses."""
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    yield from running(PostgresServer())


@pytest.fixture
def pg_dsn(postgres_server: PostgresServer) -> str:
    """A fresh schema of its own for each test (first on the connection's search path),
    with the fence table and ``kv``. Schemas, not databases: a database per test costs
    seconds of checkpoint at shutdown with fsync on."""
    name = fresh_database_name()
    with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {name}")
    dsn = postgres_server.dsn() + f" options=-csearch_path={name}"
    with psycopg.connect(dsn) as conn:
        pg_gate.migrate(conn)
        conn.execute("CREATE TABLE kv (key text PRIMARY KEY, value text NOT NULL)")
        conn.commit()
    return dsn


@pytest.fixture
def sqlite_path(tmp_path: Path) -> str:
    """A database file with the fence table and ``kv``."""
    path = str(tmp_path / "app.db")
    conn = sqlite3.connect(path, isolation_level=None)
    sqlite_gate.migrate(conn)
    conn.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.close()
    return path


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDBServer]:
    yield from running(MariaDBServer())


@pytest.fixture
def mysql_db(mariadb_server: MariaDBServer) -> dict:
    """A fresh database of its own for each test, with the fence table and ``kv``: the
    keyword arguments of ``pymysql.connect``."""
    name = fresh_database_name()
    args = {"host": "127.0.0.1", "port": mariadb_server.port, "user": "root"}
    with contextlib.closing(pymysql.connect(**args)) as admin, admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    args["database"] = name
    with contextlib.closing(pymysql.connect(**args)) as conn:
        mysql_gate.migrate(conn)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE kv (`key` VARCHAR(64) PRIMARY KEY, value TEXT NOT NULL) ENGINE = InnoDB")
    return args

"""The gate targets' application in Python (``palisade verify --gate-lang python``).

The same service as the Rust one in ``gate_store.rs``: the fenced store's routes
(``/v1/kv/{lock}/{*key}`` get, put and delete, ``/v1/kv/{lock}`` list,
``/v1/fences/{lock}`` get and post, ``/healthz``), with each write going through the
Python gate (``palisade.gates.postgres`` or ``palisade.gates.sqlite``) exactly as
``docs/protecting-your-database.md`` tells users to: one transaction per request, the
admit, then the write, then ``COMMIT``; a refused admit writes nothing and is answered with
the server's error (``409 stale_token`` with both epochs). A database that fails or went
away is ``503 storage_failed``, which the workers record as "may have happened".

``palisade verify`` writes this file into the run's folder and runs it with the
interpreter given by ``--python`` (``palisade-client`` with psycopg installed there). It
binds its port last, once the database is set up and the issuer's keys fetched, so a
port that accepts connections means ready. With ``--unsafe`` the PostgreSQL preflight must
refuse the database (the negative control): its words go to ``--refusal-file`` and the
table is installed anyway, as by a user who skipped the check.

Standard library only besides the package and its drivers: ``http.server`` is enough for
five workers on loopback.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

from palisade import Client, ConflictError, PalisadeError
from palisade.tokens import KeyRing, Verifier

#: How long a request may wait on the database, as in the Rust application.
DEADLINE_S = 5
#: How many times a write retries a lost race on a lock's first admit.
CONFLICT_RETRIES = 5
#: The HTTP status of each code the gates raise (crates/api/src/code.rs).
STATUS = {
    "missing_token": 400,
    "invalid_token": 400,
    "wrong_lock": 403,
    "not_found": 404,
    "stale_token": 409,
    "stale_sequence": 409,
    "write_conflict": 409,
    "storage_failed": 503,
}

PG_SCHEMA = """
    CREATE TABLE IF NOT EXISTS verify_kv (
        lock text NOT NULL, key text NOT NULL, value bytea NOT NULL,
        revision bigint NOT NULL, epoch bigint NOT NULL, PRIMARY KEY (lock, key));
    CREATE SEQUENCE IF NOT EXISTS verify_revision;
"""
SQLITE_SCHEMA = """
    CREATE TABLE IF NOT EXISTS verify_kv (
        lock TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
        revision INTEGER NOT NULL, epoch INTEGER NOT NULL, PRIMARY KEY (lock, key));
    CREATE TABLE IF NOT EXISTS verify_revision (
        id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL);
    INSERT OR IGNORE INTO verify_revision (id, last) VALUES (1, 0);
"""


class NotFound(Exception):
    """No such key (a delete): nothing is committed."""


class Store:
    """One database behind a gate; the subclasses say how to connect and the SQL."""

    module: Any = None
    upsert = delete = next_revision = read_sql = list_sql = ""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier

    def transaction(self) -> Any:
        """A context manager giving a connection inside one transaction that commits when
        the block succeeds and rolls back when it raises."""
        raise NotImplementedError

    def query(self, sql: str, params: Tuple[Any, ...]) -> List[Tuple[Any, ...]]:
        raise NotImplementedError

    def high_water(self, lock: str) -> int:
        raise NotImplementedError

    def transact(self, lock: str, token: str, write: Optional[Tuple[str, Optional[bytes]]]) -> Tuple[int, Optional[int]]:
        """Admit, then ``write`` (``(key, value)`` a put, ``(key, None)`` a delete, ``None``
        the barrier), then commit. The admitted epoch and the write's revision."""
        for _ in range(CONFLICT_RETRIES):
            try:
                with self.transaction() as conn:
                    epoch = self.module.admit(conn, self.verifier, token, lock).epoch
                    if write is None:
                        return epoch, None
                    key, value = write
                    revision = int(conn.execute(self.next_revision).fetchone()[0])
                    if value is not None:
                        conn.execute(self.upsert, (lock, key, value, revision, epoch))
                    elif conn.execute(self.delete, (lock, key)).rowcount == 0:
                        raise NotFound()
                    return epoch, revision
            except ConflictError:
                continue
        raise ConflictError("the lock's first admit lost its race every time")


class PgStore(Store):
    upsert = ("INSERT INTO verify_kv (lock, key, value, revision, epoch) VALUES (%s, %s, %s, %s, %s) "
              "ON CONFLICT (lock, key) DO UPDATE SET value = excluded.value, "
              "revision = excluded.revision, epoch = excluded.epoch")
    delete = "DELETE FROM verify_kv WHERE lock = %s AND key = %s"
    next_revision = "SELECT nextval('verify_revision')"
    read_sql = "SELECT value, revision, epoch FROM verify_kv WHERE lock = %s AND key = %s"
    list_sql = "SELECT key FROM verify_kv WHERE lock = %s AND starts_with(key, %s) ORDER BY key"

    def __init__(self, verifier: Verifier, dsn: str, unsafe: bool, refusal_file: Optional[str]) -> None:
        import psycopg
        from palisade.gates import postgres
        from palisade.gates.preflight import UnsafeDatabaseError

        super().__init__(verifier)
        self.psycopg, self.module, self.dsn = psycopg, postgres, dsn
        with self.connect() as conn:
            try:
                postgres.preflight(conn)
                if unsafe:
                    sys.exit("the gate's preflight accepted a database started with an unsafe setting")
            except UnsafeDatabaseError as e:
                if not unsafe:
                    raise
                if refusal_file:
                    with open(refusal_file, "w", encoding="utf-8") as out:
                        out.write(str(e))
            postgres.migrate_unchecked(conn)
            conn.execute(PG_SCHEMA)
            conn.commit()
            # Durable whatever the settings: the control is about the run's marks.
            conn.autocommit = True
            conn.execute("CHECKPOINT")

    def connect(self) -> Any:
        # Every request opens its own connection, as the Rust application does: no pooled
        # session outlives a database crash.
        return self.psycopg.connect(self.dsn, connect_timeout=DEADLINE_S)

    def transaction(self) -> Any:
        return _PgTransaction(self)

    def query(self, sql: str, params: Tuple[Any, ...]) -> List[Tuple[Any, ...]]:
        with self.connect() as conn:
            return list(conn.execute(sql, params).fetchall())

    def high_water(self, lock: str) -> int:
        with self.connect() as conn:
            return int(self.module.high_water(conn, lock).epoch)


class _PgTransaction:
    """A fresh connection and ``conn.transaction()`` on it, closed at the end."""

    def __init__(self, store: PgStore) -> None:
        self.store = store

    def __enter__(self) -> Any:
        self.conn = self.store.connect()
        self.tx = self.conn.transaction()
        self.tx.__enter__()
        return self.conn

    def __exit__(self, *exc: Any) -> bool:
        try:
            return bool(self.tx.__exit__(*exc))
        finally:
            self.conn.close()


class SqliteStore(Store):
    upsert = ("INSERT INTO verify_kv (lock, key, value, revision, epoch) VALUES (?, ?, ?, ?, ?) "
              "ON CONFLICT (lock, key) DO UPDATE SET value = excluded.value, "
              "revision = excluded.revision, epoch = excluded.epoch")
    delete = "DELETE FROM verify_kv WHERE lock = ? AND key = ?"
    next_revision = "UPDATE verify_revision SET last = last + 1 WHERE id = 1 RETURNING last"
    read_sql = "SELECT value, revision, epoch FROM verify_kv WHERE lock = ? AND key = ?"
    list_sql = "SELECT key FROM verify_kv WHERE lock = ? AND substr(key, 1, length(?2)) = ?2 ORDER BY key"

    def __init__(self, verifier: Verifier, path: str, synchronous: str) -> None:
        from palisade.gates import sqlite

        super().__init__(verifier)
        self.module = sqlite
        # One connection for the process (SQLite has one writer per file), one call at a
        # time.
        self.conn = sqlite3.connect(path, timeout=DEADLINE_S, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is durable when acknowledged; OFF only for the negative control of
        # a power loss.
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.conn.executescript(SQLITE_SCHEMA)
        sqlite.migrate(self.conn)
        self.mutex = threading.Lock()

    def transaction(self) -> Any:
        return _SqliteTransaction(self)

    def query(self, sql: str, params: Tuple[Any, ...]) -> List[Tuple[Any, ...]]:
        with self.mutex:
            return list(self.conn.execute(sql, params).fetchall())

    def high_water(self, lock: str) -> int:
        with self.mutex:
            return int(self.module.high_water(self.conn, lock).epoch)


class _SqliteTransaction:
    """The process's connection, held, in ``sqlite.transaction`` (``BEGIN IMMEDIATE``)."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    def __enter__(self) -> Any:
        self.store.mutex.acquire()
        self.tx = self.store.module.transaction(self.store.conn)
        try:
            return self.tx.__enter__()
        except BaseException:
            self.store.mutex.release()
            raise

    def __exit__(self, *exc: Any) -> bool:
        try:
            return bool(self.tx.__exit__(*exc))
        finally:
            self.store.mutex.release()


def error_answer(e: BaseException) -> Tuple[int, Dict[str, Any]]:
    """The status and body the server would send for ``e``."""
    if isinstance(e, NotFound):
        code, message, extra = "not_found", "no such key", {}
    elif isinstance(e, PalisadeError) and e.code in STATUS:
        code, message = e.code, str(e)
        extra = {name: getattr(e, name) for name in ("high_water", "epoch", "token_lock") if hasattr(e, name)}
        if code == "stale_sequence":
            extra = {name: getattr(e, name) for name in ("high_water", "high_water_seq", "epoch", "seq")}
    else:
        code, message, extra = "storage_failed", f"{type(e).__name__}: {e}", {}
    return STATUS[code], {"error": dict(code=code, message=message, **extra)}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store: Store

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # one line per request would drown the log

    def send(self, status: int, body: bytes, headers: Optional[Dict[str, str]] = None, json_body: bool = True) -> None:
        self.send_response(status)
        if json_body:
            self.send_header("content-type", "application/json")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self, op: Callable[[], Any]) -> None:
        try:
            result = op()
        except Exception as e:  # every failure is answered, typed, as the server would
            status, body = error_answer(e)
            self.send(status, json.dumps(body).encode())
            return
        if isinstance(result, tuple):
            self.send(200, *result)
        else:
            self.send(200, json.dumps(result).encode())

    def route(self) -> Tuple[str, str, Optional[str], Dict[str, List[str]]]:
        """(kind, lock, key, query) of the request's path; kind is kv, fences or healthz."""
        parts = urlsplit(self.path)
        segments = [unquote(s) for s in parts.path.split("/")]
        query = parse_qs(parts.query)
        if segments[1:] == ["healthz"]:
            return "healthz", "", None, query
        if len(segments) >= 4 and segments[1] == "v1" and segments[2] in ("kv", "fences"):
            key = "/".join(segments[4:]) if len(segments) > 4 else None
            return segments[2], segments[3], key, query
        return "none", "", None, query

    def token(self) -> str:
        return self.headers.get("fencing-token", "")

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("content-length", "0")))

    def do_GET(self) -> None:
        kind, lock, key, query = self.route()
        store = self.store
        if kind == "healthz":
            self.answer(lambda: {"status": "ok"})
        elif kind == "kv" and key is None:
            prefix = query.get("prefix", [""])[0]
            self.answer(lambda: {"lock": lock, "keys": [r[0] for r in store.query(store.list_sql, (lock, prefix))]})
        elif kind == "kv":
            def read() -> Any:
                rows = store.query(store.read_sql, (lock, key))
                if not rows:
                    raise NotFound()
                value, revision, epoch = rows[0]
                return bytes(value), {"etag": f'"{revision}"', "fencing-epoch": str(epoch)}, False
            self.answer(read)
        elif kind == "fences":
            self.answer(lambda: {"lock": lock, "high_water": store.high_water(lock), "seq": 0, "policy": "epoch"})
        else:
            self.send(404, json.dumps({"error": {"code": "not_found", "message": "no such route"}}).encode())

    def do_PUT(self) -> None:
        self.mutate(self.body())

    def do_DELETE(self) -> None:
        self.mutate(None)

    def mutate(self, value: Optional[bytes]) -> None:
        """A put of ``value``, or a delete (``None``)."""
        kind, lock, key, _ = self.route()
        if kind != "kv" or key is None:
            self.send(405, json.dumps({"error": {"code": "method_not_allowed", "message": self.command}}).encode())
            return
        self.answer(lambda: written(self.store.transact(lock, self.token(), (key, value))))

    def do_POST(self) -> None:
        kind, lock, _, _ = self.route()
        self.body()
        if kind != "fences":
            self.send(405, json.dumps({"error": {"code": "method_not_allowed", "message": "POST"}}).encode())
            return

        def fence() -> Any:
            epoch, _ = self.store.transact(lock, self.token(), None)
            # Admitted: the mark is now this epoch.
            return {"lock": lock, "high_water": epoch, "epoch": epoch}
        self.answer(fence)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A worker that gave up (a cut or delayed connection) is not an error of this
        # service; anything else is, and goes to the log.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def written(result: Tuple[int, Optional[int]]) -> Dict[str, int]:
    epoch, revision = result
    return {"revision": revision or 0, "epoch": epoch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["postgres", "sqlite"], required=True)
    parser.add_argument("--dsn", help="PostgreSQL connection string")
    parser.add_argument("--file", help="the SQLite file")
    parser.add_argument("--synchronous", choices=["FULL", "OFF"], default="FULL", help="PRAGMA synchronous of the SQLite file")
    parser.add_argument("--listen", required=True, help="host:port to serve on")
    parser.add_argument("--lock-url", required=True, help="the Palisade server whose keys verify tokens")
    parser.add_argument("--unsafe", action="store_true", help="the preflight must refuse the database")
    parser.add_argument("--refusal-file", help="where the preflight's refusal is written")
    args = parser.parse_args()

    with Client(args.lock_url) as client:
        verifier = Verifier(KeyRing.from_public_keys(client.keys()), 1024)
    if args.db == "postgres":
        Handler.store = PgStore(verifier, args.dsn, args.unsafe, args.refusal_file)
    else:
        Handler.store = SqliteStore(verifier, args.file, args.synchronous)
    host, port = args.listen.rsplit(":", 1)
    Server((host, int(port)), Handler).serve_forever()


if __name__ == "__main__":
    main()

"""Five languages on one PostgreSQL table: writers in Rust, Python, Go, Java and
TypeScript take one lock in turn through a real ``palisade serve`` and write through their
own gate (``palisade_adapters::postgres``, ``palisade.gates.postgres``, Go's
``gate/postgres``, Java's ``PostgresGate``, TypeScript's ``gates/postgres``) into one
``kv`` table guarded by one ``palisade_fence`` row. Every stale writer is refused by every
language's gate; the final row is the newest holder's. With the table protected in the
database (``palisade admin protect``), every language's gated write still goes through and
a write through no gate is refused by PostgreSQL itself, until ``admin unprotect``.

The writers other than Python are command-line programs with the Rust ``fenced_writer``'s
arguments and outcome lines, named by ``PALISADE_FENCED_WRITER`` (Rust),
``PALISADE_GO_WRITER``, ``PALISADE_JAVA_WRITER`` and ``PALISADE_TS_WRITER`` (each a
command line, split like a shell's); ``scripts/cross-language-test`` builds them and runs
this file. A missing writer fails the test: it never skips.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import Callable, Dict, List

import pytest

from palisade import Client, Grant
from palisade.tokens import KeyRing, Verifier

from gates_support import PgGate
from servers import PalisadeServer, PostgresServer, fenced_writer_bin, palisade_bin
from test_cross_language import outcome, public_keys_hex

pytestmark = pytest.mark.five_languages

LANGUAGES = ["rust", "python", "go", "java", "typescript"]
ENV = {"go": "PALISADE_GO_WRITER", "java": "PALISADE_JAVA_WRITER", "typescript": "PALISADE_TS_WRITER"}

Writer = Callable[[str, str, str], str]


def command_writer(argv: List[str], db: str, keys: str, lock: str) -> Writer:
    def write(token: str, key: str, value: str) -> str:
        done = subprocess.run(
            [*argv, "write", "--db", db, "--table", "kv", "--public-key", keys, "--lock", lock,
             "--key", key, "--value", value, "--token", token],
            capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, f"{argv[0]} failed ({done.returncode}): {done.stderr}"
        lines = done.stdout.splitlines()
        assert len(lines) == 1, done.stdout
        return lines[0]

    return write


def jdbc_url(pg: PostgresServer, dsn: str) -> str:
    """The JDBC spelling of the test's DSN: same server, same schema on the search path."""
    schema = dsn.rsplit("search_path=", 1)[1]
    return f"jdbc:postgresql://127.0.0.1:{pg.port}/postgres?user=postgres&options=-csearch_path%3D{schema}"


@pytest.fixture
def writers(client: Client, pg_dsn: str, postgres_server: PostgresServer, lock_name: str) -> Dict[str, Writer]:
    keys = ",".join(public_keys_hex(client))
    gate = PgGate(pg_dsn, Verifier(KeyRing.from_public_keys(client.keys())))
    found: Dict[str, Writer] = {
        "rust": command_writer([str(fenced_writer_bin())], f"postgres:{pg_dsn}", keys, lock_name),
        "python": lambda token, key, value: outcome(lambda: gate.run(token, lock_name, key, value)),
    }
    for language, env in ENV.items():
        command = os.environ.get(env)
        assert command, f"{env} is not set: run scripts/cross-language-test"
        db = jdbc_url(postgres_server, pg_dsn) if language == "java" else pg_dsn
        found[language] = command_writer(shlex.split(command), f"postgres:{db}", keys, lock_name)
    return found


def read(gate_dsn: str, key: str) -> object:
    import psycopg

    with psycopg.connect(gate_dsn) as conn:
        row = conn.execute("SELECT value FROM kv WHERE key = %s", (key,)).fetchone()
        mark = conn.execute("SELECT epoch FROM palisade_fence").fetchall()
    return (row[0] if row else None, [m[0] for m in mark])


def test_five_writers_take_the_lock_in_turn(
    writers: Dict[str, Writer], client: Client, server: PalisadeServer, pg_dsn: str, lock_name: str
) -> None:
    """Round n: the n-th language acquires (epoch n) and writes; then every language
    tries the previous holder's token and is refused with stale_token n:n-1. At the end
    every language tries the first holder's token too, and bad tokens: all refused."""
    leases: List[Grant] = []
    for n, language in enumerate(LANGUAGES, start=1):
        if leases:
            client.release(leases[-1].lease_id)
        lease = client.acquire_grant(lock_name, holder=language, ttl_ms=60_000)
        assert lease.epoch == n
        assert writers[language](lease.token, "shared", f"{language}-{n}") == f"admitted {n} {n}", language
        if leases:
            previous = leases[-1]
            for other in LANGUAGES:
                got = writers[other](previous.token, "shared", f"{other}-late")
                assert got == f"refused stale_token {n}:{n - 1}", f"{other} with epoch {n - 1}"
        leases.append(lease)
    newest = len(LANGUAGES)
    assert read(pg_dsn, "shared") == (f"typescript-{newest}", [newest])
    other_lock = client.acquire_grant(lock_name + "-other", holder="x", ttl_ms=60_000)
    for language in LANGUAGES:
        writer = writers[language]
        assert writer(leases[0].token, "shared", "oldest") == f"refused stale_token {newest}:1", language
        assert writer("", "shared", "x") == "refused missing_token -", language
        assert writer("2", "shared", "x") == "refused invalid_token malformed", language
        assert writer(other_lock.token, "shared", "x") == f"refused wrong_lock {lock_name}-other", language
        # The newest holder's own token, again, from every language: equal epoch admitted (S8).
        assert writer(leases[-1].token, "shared", f"again-{language}") == f"admitted {newest} {newest}", language
    assert read(pg_dsn, "shared") == ("again-typescript", [newest])
    # In-database enforcement (palisade admin protect): with kv protected for the lock,
    # every language's gated write still goes through (each gate's admit writes the lock's
    # fence row, which the guard reads), and a write through no gate is refused by
    # PostgreSQL itself, naming the lock.
    import json

    import psycopg

    def admin(*args: str) -> object:
        done = subprocess.run([str(palisade_bin()), "admin", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert admin("protect", "--postgres", pg_dsn, "--table", "kv", "--lock", lock_name) == {
        "table": "kv", "lock": lock_name, "protected": True}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for language in LANGUAGES:
            got = writers[language](leases[-1].token, "shared", f"protected-{language}")
            assert got == f"admitted {newest} {newest}", f"{language} through a protected table"
            assert writers[language](leases[0].token, "shared", "oldest") == f"refused stale_token {newest}:1"
        with pytest.raises(psycopg.errors.RaiseException, match=f'lock "{lock_name}"'):
            conn.execute("UPDATE kv SET value = 'psql' WHERE key = 'shared'")
        assert admin("unprotect", "--postgres", pg_dsn, "--table", "kv") == {"table": "kv", "protected": False}
        conn.execute("UPDATE kv SET value = 'psql' WHERE key = 'other'")
    assert read(pg_dsn, "shared") == ("protected-typescript", [newest])
    client.release(leases[-1].lease_id)
    client.release(other_lock.lease_id)

"""Rust and Python on one database: the Rust gates (``fenced_writer``, an example of
``palisade-adapters``) and the Python gates guard the same table with the same fence
table, and decide every token the same way.

The tokens come from a real ``palisade serve`` (the path users take) and, for the
verification corpus, from a key made here: minted by Rust's ``Signer`` and by Python,
plus hand-made non-canonical and malformed variants.
"""

from __future__ import annotations

import base64
import sqlite3
import subprocess
import threading
from typing import Any, Callable, List, Tuple

import nacl.signing
import pytest

from palisade import (
    Client,
    InvalidTokenError,
    MalformedTokenError,
    PalisadeError,
    StaleSequenceError,
    StaleTokenError,
    UnknownKeyError,
    BadSignatureError,
    WrongLockError,
)
from palisade.gates import Admitted
from palisade.gates import sqlite as sqlite_gate
from palisade.tokens import Claims, KeyRing, Verifier, canonical_payload, key_id_of

from gates_support import PgGate, SqliteGate
from servers import PalisadeServer, fenced_writer_bin, run_writer


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def public_keys_hex(client: Client) -> List[str]:
    return [base64.urlsafe_b64decode(k.public_key + "==").hex() for k in client.keys()]


def outcome(fn: Callable[[], Any]) -> str:
    """A Python gate's outcome in the Rust writer's words."""
    try:
        admitted = fn()
    except InvalidTokenError as e:
        kind = {MalformedTokenError: "malformed", UnknownKeyError: "unknown_key", BadSignatureError: "bad_signature"}
        return f"refused invalid_token {kind.get(type(e), '-')}"
    except StaleTokenError as e:
        return f"refused stale_token {e.high_water}:{e.epoch}"
    except StaleSequenceError as e:
        return f"refused stale_sequence {e.high_water}:{e.high_water_seq}:{e.epoch}:{e.seq}"
    except WrongLockError as e:
        return f"refused wrong_lock {e.token_lock}"
    except PalisadeError as e:
        return f"refused {e.code} -"
    return f"admitted {admitted.epoch} {admitted.high_water.epoch}"


class Db:
    """One database seen from both languages: the Python gate and the Rust writer's
    ``--db`` argument."""

    def __init__(self, gate: Any, rust_db: str, keys: List[str]) -> None:
        self.gate = gate
        self.rust_db = rust_db
        self.keys = ",".join(keys)

    def rust(self, token: str, lock: str, key: str, value: str, *extra: str) -> List[str]:
        return run_writer(["write", "--db", self.rust_db, "--table", "kv", "--public-key", self.keys,
                           "--lock", lock, "--key", key, "--value", value, "--token", token, *extra])

    def python(self, token: Any, lock: str, key: str, value: str, seq: Any = None) -> str:
        return outcome(lambda: self._python_write(token, lock, key, value, seq))

    def _python_write(self, token: Any, lock: str, key: str, value: str, seq: Any) -> Admitted:
        admitted: Admitted = self.gate.run(token, lock, key, value, seq=seq)
        return admitted


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: Any, server: PalisadeServer, client: Client) -> Db:
    keys = public_keys_hex(client)
    verifier = Verifier(KeyRing.from_public_keys(client.keys()))
    if request.param == "sqlite":
        path = request.getfixturevalue("sqlite_path")
        return Db(SqliteGate(path, verifier), f"sqlite:{path}", keys)
    dsn = request.getfixturevalue("pg_dsn")
    return Db(PgGate(dsn, verifier), f"postgres:{dsn}", keys)


def test_rust_and_python_writers_on_one_table(db: Db, client: Client, lock_name: str) -> None:
    """The fencing.py scenario with the two leaders in two languages, on real tokens."""
    key = "shared"
    old = client.acquire_grant(lock_name, holder="python-old", ttl_ms=30_000)
    client.release(old.lease_id)
    new = client.acquire_grant(lock_name, holder="rust-new", ttl_ms=30_000)
    assert (old.epoch, new.epoch) == (1, 2)

    assert db.python(old.token, lock_name, key, "python-1") == "admitted 1 1"
    assert db.rust(new.token, lock_name, key, "rust-2") == ["admitted 2 2"]
    # Rust raised the mark; Python's old leader is refused by it, and so is Rust's.
    assert db.python(old.token, lock_name, key, "python-late") == "refused stale_token 2:1"
    assert db.rust(old.token, lock_name, key, "rust-late") == ["refused stale_token 2:1"]
    assert db.gate.read(key) == "rust-2"
    # Equal epoch from the other language: admitted (S8).
    assert db.python(new.token, lock_name, key, "python-2") == "admitted 2 2"
    # Bad tokens are refused by Rust as by Python, and change nothing (S12).
    for bad, expected in [("", "refused missing_token -"), ("2", "refused invalid_token malformed"), ("true", "refused invalid_token malformed")]:
        assert db.rust(bad, lock_name, key, "bad") == [expected]
        assert db.python(bad, lock_name, key, "bad") == expected
    assert db.gate.read(key) == "python-2"
    # A third acquisition, written by Rust: Python's epoch 2 is now stale.
    client.release(new.lease_id)
    newest = client.acquire_grant(lock_name, holder="rust-newest", ttl_ms=30_000)
    assert db.rust(newest.token, lock_name, key, "rust-3") == ["admitted 3 3"]
    assert db.python(new.token, lock_name, key, "python-too-late") == "refused stale_token 3:2"
    assert (db.gate.read(key), db.gate.high_water(lock_name)) == ("rust-3", 3)
    client.release(newest.lease_id)


def test_sequence_policy_across_languages(db: Db, client: Client, lock_name: str) -> None:
    grant = client.acquire_grant(lock_name, holder="seq", ttl_ms=30_000)
    t = grant.token
    assert db.python(t, lock_name, "s", "py-1", seq=1) == "admitted 1 1"
    assert db.rust(t, lock_name, "s", "rust-5", "--seq", "5") == ["admitted 1 1"]
    assert db.python(t, lock_name, "s", "py-5", seq=5) == "refused stale_sequence 1:5:1:5"
    assert db.rust(t, lock_name, "s", "rust-3", "--seq", "3") == ["refused stale_sequence 1:5:1:3"]
    assert db.python(t, lock_name, "s", "py-6", seq=6) == "admitted 1 1"
    assert db.gate.read("s") == "py-6"
    client.release(grant.lease_id)


def test_rust_and_python_writers_racing(db: Db, client: Client, lock_name: str) -> None:
    """A Rust process writes epoch 2 twenty times while Python threads write epoch 1.
    No epoch-1 write is admitted after Rust reported an epoch-2 commit, and Rust's last
    write is the final value."""
    old = client.acquire_grant(lock_name, holder="py", ttl_ms=30_000)
    client.release(old.lease_id)
    new = client.acquire_grant(lock_name, holder="rust", ttl_ms=30_000)
    rust = subprocess.Popen(
        [str(fenced_writer_bin()), "write", "--db", db.rust_db, "--table", "kv", "--public-key", db.keys,
         "--lock", lock_name, "--key", "race", "--value", "rust", "--token", new.token, "--count", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    rust_committed = threading.Event()
    rust_lines: List[str] = []

    def read_rust() -> None:
        assert rust.stdout is not None
        for line in rust.stdout:
            rust_lines.append(line.strip())
            rust_committed.set()  # each line is printed after its commit

    reader = threading.Thread(target=read_rust)
    reader.start()
    python_results: List[Tuple[bool, str]] = []
    while rust.poll() is None or reader.is_alive():
        after_rust = rust_committed.is_set()
        python_results.append((after_rust, db.python(old.token, lock_name, "race", "python")))
        if len(python_results) > 5000:
            break
    reader.join(timeout=60)
    assert rust.wait(timeout=60) == 0, rust.stderr.read() if rust.stderr else ""
    assert rust_lines == ["admitted 2 2"] * 20
    for after_rust, result in python_results:
        if after_rust:
            assert result == "refused stale_token 2:1", "epoch 1 admitted after Rust committed epoch 2"
        else:
            assert result in ("admitted 1 1", "refused stale_token 2:1")
    assert (db.gate.read("race"), db.gate.high_water(lock_name)) == ("rust:19", 2)
    client.release(new.lease_id)


# ---- the verifiers agree, byte for byte --------------------------------------------


TRICKY_HOLDERS = [
    "",
    "plain",
    'quote " and backslash \\ and slash /',
    "".join(chr(c) for c in range(0x20)),  # every control character
    "del \x7f and nbsp \u00a0",
    "caf\u00e9 \u4e2d\u6587 \U0001f600",
    "line sep \u2028 para sep \u2029",
    "x" * 256,
    "\u00e9" * 128,  # 256 bytes of UTF-8
]


class Corpus:
    """Tokens for lock ``L`` under one key made here, plus a server's real tokens."""

    LOCK = "corpus-lock"

    def __init__(self) -> None:
        self.key = nacl.signing.SigningKey.generate()
        self.public = bytes(self.key.verify_key)
        self.key_id = key_id_of(self.public)

    def sign(self, payload: bytes, prefix: str = "pal1") -> str:
        signed = f"{prefix}.{b64(payload)}"
        return signed + "." + b64(self.key.sign(signed.encode()).signature)

    def rust_mint(self, lock: str, epoch: int, holder: str) -> str:
        return run_writer(["mint", "--secret", bytes(self.key).hex(), "--lock", lock, "--epoch", str(epoch),
                           "--holder-hex", holder.encode().hex()])[0]

    def python_mint(self, lock: str, epoch: int, holder: str) -> str:
        return self.sign(canonical_payload(Claims(lock, epoch, holder, self.key_id)))

    def json_variant(self, text: str) -> str:
        """A payload written by hand, signed with the trusted key: only the format
        rules can refuse it."""
        return self.sign(text.encode("utf-8", "surrogatepass"))


def variants(c: Corpus, genuine: str) -> List[Tuple[str, str]]:
    L, k = Corpus.LOCK, c.key_id
    good = f'{{"l":"{L}","e":1,"h":"h","k":"{k}"}}'
    head, payload_b64, sig_b64 = genuine.split(".")
    flipped_sig = sig_b64[:10] + ("A" if sig_b64[10] != "A" else "B") + sig_b64[11:]
    other_key = nacl.signing.SigningKey.generate()
    foreign_payload = canonical_payload(Claims(L, 5, "f", key_id_of(bytes(other_key.verify_key))))
    foreign_signed = "pal1." + b64(foreign_payload)
    foreign = foreign_signed + "." + b64(other_key.sign(foreign_signed.encode()).signature)
    cases = [
        ("genuine", genuine),
        ("hand-written canonical", c.json_variant(good)),
        ("space after colon", c.json_variant(good.replace('"e":1', '"e": 1'))),
        ("fields reordered", c.json_variant(f'{{"e":1,"l":"{L}","h":"h","k":"{k}"}}')),
        ("escaped ascii", c.json_variant(good.replace('"h":"h"', '"h":"\\u0068"'))),
        ("escaped slash", c.json_variant(good.replace('"h":"h"', '"h":"a\\/b"'))),
        ("uppercase hex escape", c.json_variant(good.replace('"h":"h"', '"h":"\\u001F"'))),
        ("lowercase hex escape", c.json_variant(good.replace('"h":"h"', '"h":"\\u001f"'))),
        ("escaped emoji pair", c.json_variant(good.replace('"h":"h"', '"h":"\\ud83d\\ude00"'))),
        ("lone surrogate", c.json_variant(good.replace('"h":"h"', '"h":"\\ud800"'))),
        ("extra field", c.json_variant(good[:-1] + ',"x":1}')),
        ("missing field", c.json_variant(f'{{"l":"{L}","e":1,"h":"h"}}')),
        ("duplicate field", c.json_variant(f'{{"l":"{L}","e":1,"e":1,"h":"h","k":"{k}"}}')),
        ("float epoch", c.json_variant(good.replace('"e":1', '"e":1.0'))),
        ("exponent epoch", c.json_variant(good.replace('"e":1', '"e":1e0'))),
        ("string epoch", c.json_variant(good.replace('"e":1', '"e":"1"'))),
        ("zero epoch", c.json_variant(good.replace('"e":1', '"e":0'))),
        ("negative epoch", c.json_variant(good.replace('"e":1', '"e":-1'))),
        ("bool epoch", c.json_variant(good.replace('"e":1', '"e":true'))),
        ("huge epoch", c.json_variant(good.replace('"e":1', '"e":18446744073709551616'))),
        ("leading zero epoch", c.json_variant(good.replace('"e":1', '"e":01'))),
        ("bad lock name", c.json_variant(good.replace(f'"l":"{L}"', '"l":"a/b"'))),
        ("dot lock name", c.json_variant(good.replace(f'"l":"{L}"', '"l":".."'))),
        ("holder too long", c.python_mint(L, 1, "x" * 257)),
        ("trailing newline in json", c.json_variant(good + "\n")),
        ("bom", c.json_variant("\ufeff" + good)),
        ("not an object", c.json_variant("[1,2]")),
        ("wrong prefix signed", c.sign(good.encode(), prefix="pal2")),
        ("padded payload", f"{head}.{payload_b64}=.{sig_b64}" if len(payload_b64) % 4 else f"{head}.{payload_b64}==.{sig_b64}"),
        ("standard alphabet", genuine.replace("-", "+").replace("_", "/") if ("-" in genuine or "_" in genuine) else genuine + "+"),
        ("flipped signature", f"{head}.{payload_b64}.{flipped_sig}"),
        ("short signature", f"{head}.{payload_b64}.{sig_b64[:-3]}"),
        ("long signature", f"{head}.{payload_b64}.{sig_b64}AAAA"),
        ("foreign key", foreign),
        ("other lock", c.python_mint("other-lock", 9, "o")),
        ("four parts", genuine + ".x"),
        ("empty", ""),
        ("blank", " \t "),
        ("surrounded by spaces", f"  {genuine}\n"),
        ("surrounded by nbsp", f"\u00a0{genuine}\u3000"),
        ("surrounded by U+001C (not white space to Rust)", f"\x1c{genuine}\x1c"),
        ("inner space", genuine[:20] + " " + genuine[20:]),
        ("too long", genuine + "A" * 4096),
        ("pal1", "pal1"),
        ("pal1..", "pal1.."),
        ("2", "2"),
        ("true", "true"),
    ]
    # Unused low bits: the last character of an unpadded base64 text carries spare bits
    # when the byte count is not a multiple of 3; setting one must be refused.
    for name, text in [("payload stray bits", payload_b64), ("signature stray bits", sig_b64)]:
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        spare = {2: 0b1111, 3: 0b11}.get(len(text) % 4)
        if spare:
            last = alphabet[alphabet.index(text[-1]) | 1]
            tampered = text[:-1] + last
            cases.append((name, genuine.replace(text, tampered)))
    return cases


def test_rust_and_python_verifiers_agree_on_every_token(server: PalisadeServer, client: Client) -> None:
    c = Corpus()
    corpus: List[Tuple[str, str]] = []
    for holder in TRICKY_HOLDERS:
        rust_token = c.rust_mint(Corpus.LOCK, 1, holder)
        python_token = c.python_mint(Corpus.LOCK, 1, holder)
        # Python's encoder writes exactly the bytes Rust's serde_json writes.
        assert rust_token == python_token, f"holder {holder!r}"
        corpus.append((f"holder {holder[:12]!r}", rust_token))
    for lock, epoch in [("a", 2**63 - 1), ("x" * 128, 7), ("A.b-c_9", 1)]:
        corpus.append((f"lock {lock[:8]} epoch {epoch}", c.rust_mint(lock, epoch, "h")))
    corpus += variants(c, c.rust_mint(Corpus.LOCK, 1, "h"))
    with client.lock(Corpus.LOCK, holder="real", ttl_ms=10_000) as lease:
        corpus.append(("server token", lease.token))

    keys = [bytes(c.public).hex(), *public_keys_hex(client)]
    ring = KeyRing()
    for key in keys:
        ring.add(bytes.fromhex(key))
    verifier = Verifier(ring)

    def python(token: str) -> str:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        sqlite_gate.migrate(conn)
        sqlite_gate.begin(conn)
        try:
            return outcome(lambda: sqlite_gate.admit(conn, verifier, token, Corpus.LOCK))
        finally:
            conn.close()

    stdin = "".join(token.encode("utf-8", "surrogatepass").hex() + "\n" for _, token in corpus)
    rust = run_writer(["verify", "--public-key", ",".join(keys), "--lock", Corpus.LOCK], stdin=stdin)
    assert len(rust) == len(corpus)
    disagreements = [(name, r, python(token)) for (name, token), r in zip(corpus, rust) if r != python(token)]
    for (name, _), line in zip(corpus, rust):
        print(f"{name:50} {line}")
    assert disagreements == []
    # The corpus exercises every outcome, so agreement is not agreement on one answer.
    seen = {line.rsplit(" ", 1)[0] if line.startswith("refused") else "admitted" for line in rust}
    assert seen >= {"admitted", "refused invalid_token", "refused missing_token", "refused wrong_lock"}
    kinds = {line.split(" ")[2] for line in rust if line.startswith("refused invalid_token")}
    assert kinds == {"malformed", "unknown_key", "bad_signature"}
